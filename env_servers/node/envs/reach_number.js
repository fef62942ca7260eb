'use strict';
// reach_number: a tool env (env.proto's header, "Tools"). Reset(seed) picks a target in [1, target_max] with
// SplitMix64 on the 64-bit seed (same seed, same target, in any process); the running total starts at 0. The agent
// acts only through two tools: `add(n)` (n a whole number from -max_add to max_add) changes the total and answers
// the new total, and `submit()` ends the task with reward 1 when the total equals the target (otherwise the
// result says so and the episode goes on). A reply without a tool call is an invalid step (format penalty); a bad
// call (unknown tool, arguments that are not a JSON object or break the schema, an empty or repeated id) is
// answered by the runtime (lib/tools.js) and earns this env's `bad_call_penalty`, the same format penalty.
// step(text, calls) gets the good calls only, each {id, name, arguments_json, arguments (parsed)}, and answers
// each one, with its id, in order, in the observation's `tool_results`.

const { ConfigError } = require('../lib/config');
const { SplitMix64 } = require('../lib/prng');

const ENV_ID = 'reach_number';

const fields = {
  target_max: { type: 'integer', default: 20, description: 'the target is drawn from 1..target_max' },
  max_add: { type: 'integer', default: 10, description: 'add(n) takes n from -max_add to max_add' },
  max_steps: { type: 'integer', default: 6, minimum: 1, description: 'turns before the episode is truncated' },
  format_penalty: { type: 'number', default: -0.1, description: 'reward of a reply without a call, or a bad call' },
};

function validate(config) {
  if (config.target_max < 1) throw new ConfigError(`config.target_max: must be >= 1, got ${config.target_max}`);
  if (config.max_add < 1) throw new ConfigError(`config.max_add: must be >= 1, got ${config.max_add}`);
  if (config.max_steps < 1) throw new ConfigError(`config.max_steps: must be >= 1, got ${config.max_steps}`);
  if (config.format_penalty > 0) {
    throw new ConfigError(`config.format_penalty: must be <= 0, got ${config.format_penalty}`);
  }
}

function tools(config) {
  return [
    {
      name: 'add',
      description: `Add n (a whole number from -${config.max_add} to ${config.max_add}) to the total.`,
      parameters: {
        type: 'object',
        properties: { n: { type: 'integer', minimum: -config.max_add, maximum: config.max_add } },
        required: ['n'],
        additionalProperties: false,
      },
    },
    {
      name: 'submit',
      description: 'Submit the total; it ends the task when it equals the target.',
      parameters: { type: 'object', properties: {}, additionalProperties: false },
    },
  ];
}

function describe(config) {
  return {
    env_id: ENV_ID,
    version: '1',
    instruction:
      'Make the total (it starts at 0) equal the target, then submit it. Act only through tool calls: ' +
      '`add(n)` adds n to the total, `submit()` submits it (the right total ends the task).',
    action_format: 'one or more tool calls: add(n) or submit()',
    example_action: 'add({"n": 3})',
    max_steps: config.max_steps,
    reward_min: config.format_penalty,
    reward_max: 1,
    deterministic: true,
    splits: { train: 0, test: 0 },
    metrics: ['action_valid', 'success', 'tool_calls'],
    tools: tools(config),
  };
}

class ReachNumberEnv {
  // The tool state (target, total, turns, submitted) is plain data: the runtime deep-copies it (lib/fork.js).
  static forkable = true;

  constructor(config) {
    this.config = config;
    this.bad_call_penalty = config.format_penalty; // the runtime's reward for a step with a bad call
    this.target = null;
  }

  reset(seed /* BigInt */) {
    this.target = new SplitMix64(seed).integer(1, this.config.target_max);
    this.total = 0;
    this.turns = 0;
    this.done = false;
    return [`Target: ${this.target}. Total: 0.`, { target: this.target }];
  }

  step(text, calls = []) {
    if (this.target === null) throw new Error('step before reset');
    const { config } = this;
    this.turns += 1;
    const toolResults = calls.map((call) => this.run(call));
    const valid = calls.length > 0;
    const reward = !valid ? config.format_penalty : this.done ? 1 : 0;
    const truncated = !this.done && this.turns >= config.max_steps;
    const left = config.max_steps - this.turns;
    let said = `Total: ${this.total}. ${left} turn${left === 1 ? '' : 's'} left.`;
    if (this.done) said = 'Correct.';
    else if (!valid) said = `Reply with tool calls: add(n) or submit(). ${said}`;
    const metrics = { action_valid: valid ? 1 : 0, success: this.done ? 1 : 0, tool_calls: calls.length };
    return [{ text: said, tool_results: toolResults }, reward, this.done, truncated, { action_valid: valid, metrics }];
  }

  /** One good call's result. */
  run(call) {
    const answer = (content, isError = false) => ({ call_id: call.id, name: call.name, content, is_error: isError });
    if (this.done) return answer('not run: the total is already submitted', true);
    if (call.name === 'add') {
      this.total += call.arguments.n;
      return answer(`total is ${this.total}`);
    }
    if (this.total === this.target) {
      this.done = true;
      return answer('correct');
    }
    return answer(`${this.total} is not the target`);
  }
}

module.exports = {
  envId: ENV_ID,
  fields,
  validate,
  describe,
  make: (config) => new ReachNumberEnv(config),
  envClass: ReachNumberEnv,
};
