'use strict';
// Envs that exist to misbehave, for fault tests; the same behaviour as tests/support/plugin_envs.py:
// - crashy: a step whose action contains "crash" throws inside the env (the item fails with INTERNAL), and one
//           containing "bad-image" returns an image that breaks the image rules (INTERNAL naming the rule);
// - slow:   each step waits delay_s seconds (asynchronously: other sessions keep being served).
// Observation = "seed=<seed> t=<steps>"; reward 1 per step; truncated after max_steps steps.

const { ConfigError } = require('../lib/config');

const fields = {
  max_steps: { type: 'integer', default: 5, minimum: 1 },
  delay_s: { type: 'number', default: 0.0 },
};

function validate(config) {
  if (config.max_steps < 1) throw new ConfigError(`config.max_steps: must be >= 1, got ${config.max_steps}`);
  if (config.delay_s < 0) throw new ConfigError(`config.delay_s: must be >= 0, got ${config.delay_s}`);
}

const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

function counterEnv(envId, { crashOn = null } = {}) {
  class CounterEnv {
    static forkable = true; // a step count and a seed: the runtime deep-copies it (lib/fork.js)

    constructor(config) {
      this.config = config;
      this.t = 0;
      this.seed = 0n;
    }

    reset(seed) {
      this.t = 0;
      this.seed = seed;
      return [`seed=${seed} t=0`, { seed: Number(seed) }];
    }

    step(action) {
      if (crashOn !== null && action.includes(crashOn)) throw new Error('boom: the env itself failed');
      if (crashOn !== null && action.includes('bad-image')) {
        // An observation breaking the image rules (a GIF labelled PNG): the server must never send it.
        const gif = { data: Buffer.from('GIF89a'), media_type: 'image/png' };
        return [{ text: `seed=${this.seed} <image>`, images: [gif] }, 0.0, false, false, {}];
      }
      const finish = () => {
        this.t += 1;
        const truncated = this.t >= this.config.max_steps;
        return [`seed=${this.seed} t=${this.t}`, 1.0, false, truncated, { metrics: { t: this.t } }];
      };
      // An async step: returns a Promise; the server awaits it without blocking other sessions.
      return this.config.delay_s > 0 ? sleep(this.config.delay_s).then(finish) : finish();
    }
  }

  return {
    envId,
    fields,
    validate,
    describe: (config) => ({
      env_id: envId,
      version: '1',
      instruction: 'count',
      action_format: 'any text',
      example_action: 'go',
      max_steps: config.max_steps,
      reward_min: 0.0,
      reward_max: 1.0,
      deterministic: true,
      splits: {},
      metrics: ['t'],
    }),
    make: (config) => new CounterEnv(config),
    envClass: CounterEnv,
  };
}

module.exports = { crashy: counterEnv('crashy', { crashOn: 'crash' }), slow: counterEnv('slow') };
