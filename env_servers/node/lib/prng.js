'use strict';
// SplitMix64 on BigInt: a small seedable PRNG whose output depends only on the 64-bit seed, so the same seed
// gives the same episode in any process, on any host (and in any language that implements SplitMix64).

const MASK64 = (1n << 64n) - 1n;

class SplitMix64 {
  constructor(seed) {
    this.state = BigInt.asUintN(64, BigInt(seed));
  }

  /** The next 64-bit output, as a BigInt in [0, 2^64). */
  next() {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & MASK64;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
    return z ^ (z >> 31n);
  }

  /** An integer in [low, high] (inclusive), as a Number; `high - low` must fit in 2^53. */
  integer(low, high) {
    const span = BigInt(high) - BigInt(low) + 1n;
    return Number(BigInt(low) + (this.next() % span));
  }
}

module.exports = { SplitMix64, MASK64 };
