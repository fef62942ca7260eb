'use strict';
// grid_picture: walk to the goal on a small grid that the agent sees only as a picture. Reset(seed) places the
// walker and the goal with SplitMix64, so the same seed gives the same picture bytes in any process. Every
// observation is text with one "<image>" marker and a PNG of the board (walker white, goal green, floor grey,
// `cell` pixels per square). Replies: up, down, left or right inside an answer tag, e.g. "<answer>up</answer>";
// reward 1 on reaching the goal (terminated); anything else is an invalid action (format penalty).

const { ConfigError } = require('../lib/config');
const { IMAGE_MARKER, encodePng } = require('../lib/images');
const { SplitMix64 } = require('../lib/prng');
const { extractAnswer } = require('./answer');

const ENV_ID = 'grid_picture';
const MOVES = { up: [0, -1], down: [0, 1], left: [-1, 0], right: [1, 0] };
const COLOURS = { floor: [96, 96, 96], walker: [255, 255, 255], goal: [0, 200, 0] };

const fields = {
  size: { type: 'integer', default: 4, description: 'squares per side' },
  cell: { type: 'integer', default: 8, description: 'pixels per square' },
  max_steps: { type: 'integer', default: 8, minimum: 1, description: 'moves before the episode is truncated' },
  format_penalty: { type: 'number', default: -0.1, description: 'reward of a reply with no valid move' },
};

function validate(config) {
  if (config.size < 2 || config.size > 32) throw new ConfigError(`config.size: must be in [2, 32], got ${config.size}`);
  if (config.cell < 1 || config.cell > 32) throw new ConfigError(`config.cell: must be in [1, 32], got ${config.cell}`);
  if (config.max_steps < 1) throw new ConfigError(`config.max_steps: must be >= 1, got ${config.max_steps}`);
}

function describe(config) {
  return {
    env_id: ENV_ID,
    version: '1',
    instruction:
      `Walk to the green square of a ${config.size}x${config.size} grid shown as a picture; you are the white ` +
      'square. Reply with one move inside an answer tag: up, down, left or right.',
    action_format: '<answer>up|down|left|right</answer>',
    example_action: '<answer>up</answer>',
    max_steps: config.max_steps,
    reward_min: Math.min(config.format_penalty, 0),
    reward_max: 1,
    deterministic: true,
    splits: { train: 0, test: 0 },
    metrics: ['action_valid', 'success'],
  };
}

class GridPictureEnv {
  static forkable = true; // walker, goal and turns are plain data: the runtime deep-copies it (lib/fork.js)

  constructor(config) {
    this.config = config;
    this.walker = null;
  }

  reset(seed /* BigInt */) {
    const rng = new SplitMix64(seed);
    const n = this.config.size;
    this.walker = [rng.integer(0, n - 1), rng.integer(0, n - 1)];
    do this.goal = [rng.integer(0, n - 1), rng.integer(0, n - 1)];
    while (this.goal[0] === this.walker[0] && this.goal[1] === this.walker[1]);
    this.turns = 0;
    return [this.observation('The board'), { size: n }];
  }

  step(text) {
    if (this.walker === null) throw new Error('step before reset');
    const { config } = this;
    this.turns += 1;
    const move = MOVES[(extractAnswer(text) || '').trim().toLowerCase()];
    const n = config.size;
    if (move) this.walker = this.walker.map((v, i) => Math.min(n - 1, Math.max(0, v + move[i])));
    const terminated = Boolean(move) && this.walker[0] === this.goal[0] && this.walker[1] === this.goal[1];
    const truncated = !terminated && this.turns >= config.max_steps;
    const reward = !move ? config.format_penalty : terminated ? 1 : 0;
    const info = { action_valid: Boolean(move), metrics: { action_valid: move ? 1 : 0, success: terminated ? 1 : 0 } };
    let said = terminated ? 'You reached the goal!' : 'Moved.';
    if (!move) said = 'Invalid reply: answer up, down, left or right.';
    return [this.observation(`${said} Turn ${this.turns}, the board`), reward, terminated, truncated, info];
  }

  /** Text with one marker, and the board as a PNG. */
  observation(prefix) {
    const { size: n, cell } = this.config;
    const width = n * cell;
    const rgb = Buffer.alloc(3 * width * width);
    for (let y = 0; y < width; y += 1) {
      for (let x = 0; x < width; x += 1) {
        const square = [Math.floor(x / cell), Math.floor(y / cell)];
        const at = (p) => p[0] === square[0] && p[1] === square[1];
        const colour = at(this.walker) ? COLOURS.walker : at(this.goal) ? COLOURS.goal : COLOURS.floor;
        rgb.set(colour, 3 * (y * width + x));
      }
    }
    const picture = { data: encodePng(width, width, rgb), media_type: 'image/png' };
    return { text: `${prefix}: ${IMAGE_MARKER}`, images: [picture] };
  }
}

module.exports = {
  envId: ENV_ID,
  fields,
  validate,
  describe,
  make: (config) => new GridPictureEnv(config),
  envClass: GridPictureEnv,
};
