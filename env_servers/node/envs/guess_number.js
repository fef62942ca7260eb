'use strict';
// guess_number: a number-guessing game (like GEM's GuessTheNumber). Reset(seed) picks a secret in [min, max]
// with SplitMix64 on the 64-bit seed, so the same seed gives the same secret in any process. Each turn the
// agent replies with a guess in an answer tag, e.g. "<answer>7</answer>", and is told "higher", "lower" or
// "correct". Reward 1 on the correct guess (terminated); a reply without a whole number in range is an invalid
// action (format penalty, action_valid = false) that still uses up a turn; the episode is truncated after
// max_steps turns.

const { ConfigError } = require('../lib/config');
const { SplitMix64 } = require('../lib/prng');
const { extractAnswer } = require('./answer');

const ENV_ID = 'guess_number';

const fields = {
  min: { type: 'integer', default: 1, description: 'smallest possible secret' },
  max: { type: 'integer', default: 20, description: 'largest possible secret' },
  max_steps: { type: 'integer', default: 10, minimum: 1, description: 'guesses before the episode is truncated' },
  format_penalty: { type: 'number', default: -0.1, description: 'reward of a reply with no valid guess' },
};

function validate(config) {
  if (config.max < config.min) {
    throw new ConfigError(`config.max: must be >= config.min (${config.min}), got ${config.max}`);
  }
  if (config.max - config.min > Number.MAX_SAFE_INTEGER) throw new ConfigError('config.max: range too large');
  if (config.max_steps < 1) throw new ConfigError(`config.max_steps: must be >= 1, got ${config.max_steps}`);
}

function middle(config) {
  return Math.floor((config.min + config.max) / 2);
}

function describe(config) {
  const example = `<answer>${middle(config)}</answer>`;
  return {
    env_id: ENV_ID,
    version: '1',
    instruction:
      `I am thinking of a whole number between ${config.min} and ${config.max} (inclusive). ` +
      `Find it in at most ${config.max_steps} guesses: after each guess you are told whether the number is ` +
      'higher or lower than your guess. Reply with your guess inside an answer tag, e.g. ' +
      `${example}. You may think before the tag; only the last answer tag counts.`,
    action_format: `one whole number between ${config.min} and ${config.max} inside <answer>...</answer>`,
    example_action: example,
    max_steps: config.max_steps,
    reward_min: Math.min(config.format_penalty, 0),
    reward_max: Math.max(1, config.format_penalty),
    deterministic: true,
    splits: { train: 0, test: 0 }, // procedurally generated from the seed
    metrics: ['action_valid', 'success'],
  };
}

/** The guess in `text`, or null when the reply holds no whole number in [min, max]. */
function parseGuess(text, config) {
  const content = extractAnswer(text);
  if (content === null) return null;
  const trimmed = content.trim();
  if (!/^[+-]?\d{1,16}$/.test(trimmed)) return null;
  const guess = Number(trimmed);
  return guess >= config.min && guess <= config.max ? guess : null;
}

class GuessNumberEnv {
  static forkable = true; // its state is plain data: the runtime deep-copies it for ForkSession (lib/fork.js)

  constructor(config) {
    this.config = config;
    this.secret = null;
    this.turns = 0;
  }

  reset(seed /* BigInt */) {
    const rng = new SplitMix64(seed);
    this.secret = rng.integer(this.config.min, this.config.max);
    this.turns = 0;
    const { min, max, max_steps: maxSteps } = this.config;
    const observation =
      `I am thinking of a whole number between ${min} and ${max} (inclusive). You have ${maxSteps} ` +
      `guesses. After each guess I tell you whether the number is higher or lower. Reply with your guess ` +
      `inside an answer tag, e.g. <answer>${middle(this.config)}</answer>.`;
    return [observation, { min, max, max_steps: maxSteps }];
  }

  step(text) {
    if (this.secret === null) throw new Error('step before reset');
    const { config } = this;
    this.turns += 1;
    const left = config.max_steps - this.turns;
    const guessesLeft = `${left} guess${left === 1 ? '' : 'es'} left.`;
    const guess = parseGuess(text, config);
    let observation;
    let reward = 0;
    let terminated = false;
    let feedback;
    if (guess === null) {
      feedback = 'invalid';
      reward = config.format_penalty;
      observation =
        `Invalid reply: put one whole number between ${config.min} and ${config.max} inside ` +
        `<answer>...</answer>, e.g. <answer>${middle(config)}</answer>. ${guessesLeft}`;
    } else if (guess === this.secret) {
      feedback = 'correct';
      reward = 1;
      terminated = true;
      observation = `${guess} is correct! You found the number in ${this.turns} guess${this.turns === 1 ? '' : 'es'}.`;
    } else {
      feedback = guess < this.secret ? 'higher' : 'lower';
      observation = `${guess} is wrong: the number is ${feedback}. ${guessesLeft}`;
    }
    const truncated = !terminated && this.turns >= config.max_steps;
    if (truncated) observation += ` No guesses left: the number was ${this.secret}.`;
    const info = {
      feedback,
      guesses_left: left,
      action_valid: guess !== null,
      metrics: { action_valid: guess === null ? 0 : 1, success: terminated ? 1 : 0 },
    };
    if (guess !== null) info.guess = guess;
    return [observation, reward, terminated, truncated, info];
  }
}

module.exports = {
  envId: ENV_ID,
  fields,
  validate,
  describe,
  make: (config) => new GuessNumberEnv(config),
  envClass: GuessNumberEnv,
  parseGuess,
  GuessNumberEnv,
};
