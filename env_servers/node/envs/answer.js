'use strict';
// `<answer>...</answer>` parsing, as env_servers/envs/answer.py: the lower-cased content of the last answer
// block, or null. Tags match case-insensitively; lastIndexOf (not a regex) keeps adversarial input linear.

const OPEN_TAG = '<answer>';
const CLOSE_TAG = '</answer>';

function extractAnswer(text) {
  if (typeof text !== 'string') return null;
  // Lower-case once and slice that same string: toLowerCase can change lengths for some code points.
  const lowered = text.toLowerCase();
  const end = lowered.lastIndexOf(CLOSE_TAG);
  if (end < 0) return null;
  const start = lowered.lastIndexOf(OPEN_TAG, end - OPEN_TAG.length);
  if (start < 0) return null;
  return lowered.slice(start + OPEN_TAG.length, end);
}

module.exports = { extractAnswer, OPEN_TAG, CLOSE_TAG };
