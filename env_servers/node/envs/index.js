'use strict';
// The env registry: env id -> {envId, fields, validate(config), describe(config), make(config)}.
// An env instance has reset(seed: BigInt, options) -> [observation, info] and
// step(text) -> [observation, reward, terminated, truncated, info]; either may return a Promise. An observation
// is a string, or {text, images: [{data: Buffer, media_type}]} with one "<image>" marker per image (grid_picture).
// A tool env lists `tools` in its spec and is stepped as step(text, calls) with the good calls only; its
// observation is {text, tool_results: [{call_id, name, content, is_error}]}, one per call, in order (reach_number).
// info.action_valid (default true) and info.metrics (name -> number) are lifted into the StepResult.
// `envClass` (optional) is the class make() builds: it is forkable when it defines fork() or sets the static
// `forkable = true` (lib/fork.js; EnvSpec.forkable, ForkSession).

const guessNumber = require('./guess_number');
const gridPicture = require('./grid_picture');
const reachNumber = require('./reach_number');
const { crashy, slow } = require('./counter');

const ENVS = [guessNumber, gridPicture, reachNumber, crashy, slow];
const REGISTRY = new Map(ENVS.map((entry) => [entry.envId, entry]));

module.exports = { REGISTRY, DEFAULT_ENVS: ENVS.map((entry) => entry.envId) };
