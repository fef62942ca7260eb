'use strict';
// The env registry: env id -> {envId, fields, validate(config), describe(config), make(config)}.
// An env instance has reset(seed: BigInt, options) -> [observation, info] and
// step(text) -> [observation, reward, terminated, truncated, info]; either may return a Promise. An observation
// is a string, or {text, images: [{data: Buffer, media_type}]} with one "<image>" marker per image (grid_picture).
// info.action_valid (default true) and info.metrics (name -> number) are lifted into the StepResult.

const guessNumber = require('./guess_number');
const gridPicture = require('./grid_picture');
const { crashy, slow } = require('./counter');

const REGISTRY = new Map([guessNumber, gridPicture, crashy, slow].map((entry) => [entry.envId, entry]));

module.exports = { REGISTRY, DEFAULT_ENVS: [guessNumber.envId, gridPicture.envId, crashy.envId, slow.envId] };
