'use strict';
// The image rules of protocol v1 (env.proto's header, "Images"), as env_servers/images.py states them, and a
// small deterministic PNG writer. An env observation is a string, or {text, images: [{data, media_type}]} with
// one "<image>" marker in the text per image, in order; one that breaks a rule is never sent.

const zlib = require('zlib');

const IMAGE_MARKER = '<image>';
const MAX_IMAGES = 8; // per observation
const MAX_IMAGE_BYTES = 2 * 1024 * 1024; // encoded data of one image
const MAGIC = {
  'image/png': Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
  'image/jpeg': Buffer.from([0xff, 0xd8, 0xff]),
};

class ImageRuleBroken extends Error {}

const countMarkers = (text) => text.split(IMAGE_MARKER).length - 1;

/** The first image rule `text` and `images` break, in words naming it; null when they keep them all. */
function imageRuleBroken(text, images) {
  if (images.length > MAX_IMAGES) return `${images.length} images: at most ${MAX_IMAGES} per observation`;
  const markers = countMarkers(text);
  if (markers !== images.length) {
    return `the text holds ${markers} ${IMAGE_MARKER} markers for ${images.length} images: one marker per image`;
  }
  for (const [k, image] of images.entries()) {
    const mediaType = image.media_type === undefined ? 'image/png' : image.media_type;
    const magic = MAGIC[mediaType];
    if (magic === undefined) {
      return `image ${k}: media_type '${mediaType}': must be one of ${Object.keys(MAGIC).join(', ')}`;
    }
    if (!(image.data instanceof Uint8Array)) return `image ${k}: data is not a Buffer or Uint8Array`;
    if (image.data.length > MAX_IMAGE_BYTES) {
      return `image ${k}: ${image.data.length} bytes of data: at most ${MAX_IMAGE_BYTES} (2 MiB) per image`;
    }
    if (!magic.equals(Buffer.from(image.data.subarray(0, magic.length)))) {
      return `image ${k}: data does not start with the ${mediaType} magic bytes`;
    }
  }
  return null;
}

/** What an env returned -> [text, images for the wire or null]; throws naming what is wrong. */
function observationParts(obs) {
  if (typeof obs === 'string' && !obs.includes(IMAGE_MARKER)) return [obs, null]; // text alone: the hot path
  let text;
  let images;
  if (typeof obs === 'string') {
    [text, images] = [obs, []];
  } else if (obs !== null && typeof obs === 'object' && typeof obs.text === 'string') {
    [text, images] = [obs.text, Array.isArray(obs.images) ? obs.images : []];
  } else {
    throw new TypeError(`observation must be a string or {text, images}, got ${typeof obs}`);
  }
  const broken = imageRuleBroken(text, images);
  if (broken !== null) throw new ImageRuleBroken(broken);
  const wire = images.map((image) => ({ data: Buffer.from(image.data), media_type: image.media_type || 'image/png' }));
  return [text, wire.length ? wire : null];
}

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k += 1) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

function crc32(buffer) {
  let c = 0xffffffff;
  for (const byte of buffer) c = CRC_TABLE[(c ^ byte) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(kind, body) {
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  const typed = Buffer.concat([Buffer.from(kind, 'latin1'), body]);
  const tail = Buffer.alloc(4);
  tail.writeUInt32BE(crc32(typed));
  return Buffer.concat([head, typed, tail]);
}

/** An 8-bit RGB PNG of width x height pixels (`rgb`: 3 bytes per pixel, row by row); same pixels, same bytes. */
function encodePng(width, height, rgb) {
  if (width < 1 || height < 1 || rgb.length !== 3 * width * height) {
    throw new RangeError(`encodePng: ${rgb.length} bytes for ${width}x${height} RGB pixels`);
  }
  const stride = 3 * width;
  const raw = Buffer.alloc((stride + 1) * height); // each row: filter byte 0, then its pixels
  for (let y = 0; y < height; y += 1) Buffer.from(rgb).copy(raw, y * (stride + 1) + 1, y * stride, (y + 1) * stride);
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  header.set([8, 2, 0, 0, 0], 8); // 8-bit, truecolour, no interlace
  const idat = zlib.deflateSync(raw, { level: 6 });
  const chunks = [chunk('IHDR', header), chunk('IDAT', idat), chunk('IEND', Buffer.alloc(0))];
  return Buffer.concat([MAGIC['image/png'], ...chunks]);
}

module.exports = {
  IMAGE_MARKER,
  ImageRuleBroken,
  MAX_IMAGES,
  MAX_IMAGE_BYTES,
  encodePng,
  imageRuleBroken,
  observationParts,
};
