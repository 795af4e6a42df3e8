// imgw-client 0.1.0 sources-sha256:9014fc80e3f3455a2688daedb3b7b7107306a86b8cee2ac8e2047d80107dc790
// Built by clients/js (npm run build:web) from src/browser.ts; do not edit. Bundles
// @msgpack/msgpack 3.1.3 (ISC licence).

// node_modules/@msgpack/msgpack/dist.esm/utils/utf8.mjs
function utf8Count(str2) {
  const strLength = str2.length;
  let byteLength = 0;
  let pos = 0;
  while (pos < strLength) {
    let value = str2.charCodeAt(pos++);
    if ((value & 4294967168) === 0) {
      byteLength++;
      continue;
    } else if ((value & 4294965248) === 0) {
      byteLength += 2;
    } else {
      if (value >= 55296 && value <= 56319) {
        if (pos < strLength) {
          const extra = str2.charCodeAt(pos);
          if ((extra & 64512) === 56320) {
            ++pos;
            value = ((value & 1023) << 10) + (extra & 1023) + 65536;
          }
        }
      }
      if ((value & 4294901760) === 0) {
        byteLength += 3;
      } else {
        byteLength += 4;
      }
    }
  }
  return byteLength;
}
function utf8EncodeJs(str2, output, outputOffset) {
  const strLength = str2.length;
  let offset = outputOffset;
  let pos = 0;
  while (pos < strLength) {
    let value = str2.charCodeAt(pos++);
    if ((value & 4294967168) === 0) {
      output[offset++] = value;
      continue;
    } else if ((value & 4294965248) === 0) {
      output[offset++] = value >> 6 & 31 | 192;
    } else {
      if (value >= 55296 && value <= 56319) {
        if (pos < strLength) {
          const extra = str2.charCodeAt(pos);
          if ((extra & 64512) === 56320) {
            ++pos;
            value = ((value & 1023) << 10) + (extra & 1023) + 65536;
          }
        }
      }
      if ((value & 4294901760) === 0) {
        output[offset++] = value >> 12 & 15 | 224;
        output[offset++] = value >> 6 & 63 | 128;
      } else {
        output[offset++] = value >> 18 & 7 | 240;
        output[offset++] = value >> 12 & 63 | 128;
        output[offset++] = value >> 6 & 63 | 128;
      }
    }
    output[offset++] = value & 63 | 128;
  }
}
var sharedTextEncoder = new TextEncoder();
var TEXT_ENCODER_THRESHOLD = 50;
function utf8EncodeTE(str2, output, outputOffset) {
  sharedTextEncoder.encodeInto(str2, output.subarray(outputOffset));
}
function utf8Encode(str2, output, outputOffset) {
  if (str2.length > TEXT_ENCODER_THRESHOLD) {
    utf8EncodeTE(str2, output, outputOffset);
  } else {
    utf8EncodeJs(str2, output, outputOffset);
  }
}
var CHUNK_SIZE = 4096;
function utf8DecodeJs(bytes, inputOffset, byteLength) {
  let offset = inputOffset;
  const end = offset + byteLength;
  const units = [];
  let result = "";
  while (offset < end) {
    const byte1 = bytes[offset++];
    if ((byte1 & 128) === 0) {
      units.push(byte1);
    } else if ((byte1 & 224) === 192) {
      const byte2 = bytes[offset++] & 63;
      units.push((byte1 & 31) << 6 | byte2);
    } else if ((byte1 & 240) === 224) {
      const byte2 = bytes[offset++] & 63;
      const byte3 = bytes[offset++] & 63;
      units.push((byte1 & 31) << 12 | byte2 << 6 | byte3);
    } else if ((byte1 & 248) === 240) {
      const byte2 = bytes[offset++] & 63;
      const byte3 = bytes[offset++] & 63;
      const byte4 = bytes[offset++] & 63;
      let unit = (byte1 & 7) << 18 | byte2 << 12 | byte3 << 6 | byte4;
      if (unit > 65535) {
        unit -= 65536;
        units.push(unit >>> 10 & 1023 | 55296);
        unit = 56320 | unit & 1023;
      }
      units.push(unit);
    } else {
      units.push(byte1);
    }
    if (units.length >= CHUNK_SIZE) {
      result += String.fromCharCode(...units);
      units.length = 0;
    }
  }
  if (units.length > 0) {
    result += String.fromCharCode(...units);
  }
  return result;
}
var sharedTextDecoder = new TextDecoder();
var TEXT_DECODER_THRESHOLD = 200;
function utf8DecodeTD(bytes, inputOffset, byteLength) {
  const stringBytes = bytes.subarray(inputOffset, inputOffset + byteLength);
  return sharedTextDecoder.decode(stringBytes);
}
function utf8Decode(bytes, inputOffset, byteLength) {
  if (byteLength > TEXT_DECODER_THRESHOLD) {
    return utf8DecodeTD(bytes, inputOffset, byteLength);
  } else {
    return utf8DecodeJs(bytes, inputOffset, byteLength);
  }
}

// node_modules/@msgpack/msgpack/dist.esm/ExtData.mjs
var ExtData = class {
  type;
  data;
  constructor(type, data) {
    this.type = type;
    this.data = data;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/DecodeError.mjs
var DecodeError = class _DecodeError extends Error {
  constructor(message2) {
    super(message2);
    const proto = Object.create(_DecodeError.prototype);
    Object.setPrototypeOf(this, proto);
    Object.defineProperty(this, "name", {
      configurable: true,
      enumerable: false,
      value: _DecodeError.name
    });
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/int.mjs
var UINT32_MAX = 4294967295;
function setUint64(view, offset, value) {
  const high = value / 4294967296;
  const low = value;
  view.setUint32(offset, high);
  view.setUint32(offset + 4, low);
}
function setInt64(view, offset, value) {
  const high = Math.floor(value / 4294967296);
  const low = value;
  view.setUint32(offset, high);
  view.setUint32(offset + 4, low);
}
function getInt64(view, offset) {
  const high = view.getInt32(offset);
  const low = view.getUint32(offset + 4);
  return high * 4294967296 + low;
}
function getUint64(view, offset) {
  const high = view.getUint32(offset);
  const low = view.getUint32(offset + 4);
  return high * 4294967296 + low;
}

// node_modules/@msgpack/msgpack/dist.esm/timestamp.mjs
var EXT_TIMESTAMP = -1;
var TIMESTAMP32_MAX_SEC = 4294967296 - 1;
var TIMESTAMP64_MAX_SEC = 17179869184 - 1;
function encodeTimeSpecToTimestamp({ sec, nsec }) {
  if (sec >= 0 && nsec >= 0 && sec <= TIMESTAMP64_MAX_SEC) {
    if (nsec === 0 && sec <= TIMESTAMP32_MAX_SEC) {
      const rv = new Uint8Array(4);
      const view = new DataView(rv.buffer);
      view.setUint32(0, sec);
      return rv;
    } else {
      const secHigh = sec / 4294967296;
      const secLow = sec & 4294967295;
      const rv = new Uint8Array(8);
      const view = new DataView(rv.buffer);
      view.setUint32(0, nsec << 2 | secHigh & 3);
      view.setUint32(4, secLow);
      return rv;
    }
  } else {
    const rv = new Uint8Array(12);
    const view = new DataView(rv.buffer);
    view.setUint32(0, nsec);
    setInt64(view, 4, sec);
    return rv;
  }
}
function encodeDateToTimeSpec(date) {
  const msec = date.getTime();
  const sec = Math.floor(msec / 1e3);
  const nsec = (msec - sec * 1e3) * 1e6;
  const nsecInSec = Math.floor(nsec / 1e9);
  return {
    sec: sec + nsecInSec,
    nsec: nsec - nsecInSec * 1e9
  };
}
function encodeTimestampExtension(object) {
  if (object instanceof Date) {
    const timeSpec = encodeDateToTimeSpec(object);
    return encodeTimeSpecToTimestamp(timeSpec);
  } else {
    return null;
  }
}
function decodeTimestampToTimeSpec(data) {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  switch (data.byteLength) {
    case 4: {
      const sec = view.getUint32(0);
      const nsec = 0;
      return { sec, nsec };
    }
    case 8: {
      const nsec30AndSecHigh2 = view.getUint32(0);
      const secLow32 = view.getUint32(4);
      const sec = (nsec30AndSecHigh2 & 3) * 4294967296 + secLow32;
      const nsec = nsec30AndSecHigh2 >>> 2;
      return { sec, nsec };
    }
    case 12: {
      const sec = getInt64(view, 4);
      const nsec = view.getUint32(0);
      return { sec, nsec };
    }
    default:
      throw new DecodeError(`Unrecognized data size for timestamp (expected 4, 8, or 12): ${data.length}`);
  }
}
function decodeTimestampExtension(data) {
  const timeSpec = decodeTimestampToTimeSpec(data);
  return new Date(timeSpec.sec * 1e3 + timeSpec.nsec / 1e6);
}
var timestampExtension = {
  type: EXT_TIMESTAMP,
  encode: encodeTimestampExtension,
  decode: decodeTimestampExtension
};

// node_modules/@msgpack/msgpack/dist.esm/ExtensionCodec.mjs
var ExtensionCodec = class _ExtensionCodec {
  static defaultCodec = new _ExtensionCodec();
  // ensures ExtensionCodecType<X> matches ExtensionCodec<X>
  // this will make type errors a lot more clear
  // eslint-disable-next-line @typescript-eslint/naming-convention
  __brand;
  // built-in extensions
  builtInEncoders = [];
  builtInDecoders = [];
  // custom extensions
  encoders = [];
  decoders = [];
  constructor() {
    this.register(timestampExtension);
  }
  register({ type, encode: encode2, decode: decode2 }) {
    if (type >= 0) {
      this.encoders[type] = encode2;
      this.decoders[type] = decode2;
    } else {
      const index = -1 - type;
      this.builtInEncoders[index] = encode2;
      this.builtInDecoders[index] = decode2;
    }
  }
  tryToEncode(object, context) {
    for (let i = 0; i < this.builtInEncoders.length; i++) {
      const encodeExt = this.builtInEncoders[i];
      if (encodeExt != null) {
        const data = encodeExt(object, context);
        if (data != null) {
          const type = -1 - i;
          return new ExtData(type, data);
        }
      }
    }
    for (let i = 0; i < this.encoders.length; i++) {
      const encodeExt = this.encoders[i];
      if (encodeExt != null) {
        const data = encodeExt(object, context);
        if (data != null) {
          const type = i;
          return new ExtData(type, data);
        }
      }
    }
    if (object instanceof ExtData) {
      return object;
    }
    return null;
  }
  decode(data, type, context) {
    const decodeExt = type < 0 ? this.builtInDecoders[-1 - type] : this.decoders[type];
    if (decodeExt) {
      return decodeExt(data, type, context);
    } else {
      return new ExtData(type, data);
    }
  }
};

// node_modules/@msgpack/msgpack/dist.esm/utils/typedArrays.mjs
function isArrayBufferLike(buffer) {
  return buffer instanceof ArrayBuffer || typeof SharedArrayBuffer !== "undefined" && buffer instanceof SharedArrayBuffer;
}
function ensureUint8Array(buffer) {
  if (buffer instanceof Uint8Array) {
    return buffer;
  } else if (ArrayBuffer.isView(buffer)) {
    return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  } else if (isArrayBufferLike(buffer)) {
    return new Uint8Array(buffer);
  } else {
    return Uint8Array.from(buffer);
  }
}

// node_modules/@msgpack/msgpack/dist.esm/Encoder.mjs
var DEFAULT_MAX_DEPTH = 100;
var DEFAULT_INITIAL_BUFFER_SIZE = 2048;
var Encoder = class _Encoder {
  extensionCodec;
  context;
  useBigInt64;
  maxDepth;
  initialBufferSize;
  sortKeys;
  forceFloat32;
  ignoreUndefined;
  forceIntegerToFloat;
  pos;
  view;
  bytes;
  entered = false;
  constructor(options) {
    this.extensionCodec = options?.extensionCodec ?? ExtensionCodec.defaultCodec;
    this.context = options?.context;
    this.useBigInt64 = options?.useBigInt64 ?? false;
    this.maxDepth = options?.maxDepth ?? DEFAULT_MAX_DEPTH;
    this.initialBufferSize = options?.initialBufferSize ?? DEFAULT_INITIAL_BUFFER_SIZE;
    this.sortKeys = options?.sortKeys ?? false;
    this.forceFloat32 = options?.forceFloat32 ?? false;
    this.ignoreUndefined = options?.ignoreUndefined ?? false;
    this.forceIntegerToFloat = options?.forceIntegerToFloat ?? false;
    this.pos = 0;
    this.view = new DataView(new ArrayBuffer(this.initialBufferSize));
    this.bytes = new Uint8Array(this.view.buffer);
  }
  clone() {
    return new _Encoder({
      extensionCodec: this.extensionCodec,
      context: this.context,
      useBigInt64: this.useBigInt64,
      maxDepth: this.maxDepth,
      initialBufferSize: this.initialBufferSize,
      sortKeys: this.sortKeys,
      forceFloat32: this.forceFloat32,
      ignoreUndefined: this.ignoreUndefined,
      forceIntegerToFloat: this.forceIntegerToFloat
    });
  }
  reinitializeState() {
    this.pos = 0;
  }
  /**
   * This is almost equivalent to {@link Encoder#encode}, but it returns an reference of the encoder's internal buffer and thus much faster than {@link Encoder#encode}.
   *
   * @returns Encodes the object and returns a shared reference the encoder's internal buffer.
   */
  encodeSharedRef(object) {
    if (this.entered) {
      const instance = this.clone();
      return instance.encodeSharedRef(object);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.doEncode(object, 1);
      return this.bytes.subarray(0, this.pos);
    } finally {
      this.entered = false;
    }
  }
  /**
   * @returns Encodes the object and returns a copy of the encoder's internal buffer.
   */
  encode(object) {
    if (this.entered) {
      const instance = this.clone();
      return instance.encode(object);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.doEncode(object, 1);
      return this.bytes.slice(0, this.pos);
    } finally {
      this.entered = false;
    }
  }
  doEncode(object, depth) {
    if (depth > this.maxDepth) {
      throw new Error(`Too deep objects in depth ${depth}`);
    }
    if (object == null) {
      this.encodeNil();
    } else if (typeof object === "boolean") {
      this.encodeBoolean(object);
    } else if (typeof object === "number") {
      if (!this.forceIntegerToFloat) {
        this.encodeNumber(object);
      } else {
        this.encodeNumberAsFloat(object);
      }
    } else if (typeof object === "string") {
      this.encodeString(object);
    } else if (this.useBigInt64 && typeof object === "bigint") {
      this.encodeBigInt64(object);
    } else {
      this.encodeObject(object, depth);
    }
  }
  ensureBufferSizeToWrite(sizeToWrite) {
    const requiredSize = this.pos + sizeToWrite;
    if (this.view.byteLength < requiredSize) {
      this.resizeBuffer(requiredSize * 2);
    }
  }
  resizeBuffer(newSize) {
    const newBuffer = new ArrayBuffer(newSize);
    const newBytes = new Uint8Array(newBuffer);
    const newView = new DataView(newBuffer);
    newBytes.set(this.bytes);
    this.view = newView;
    this.bytes = newBytes;
  }
  encodeNil() {
    this.writeU8(192);
  }
  encodeBoolean(object) {
    if (object === false) {
      this.writeU8(194);
    } else {
      this.writeU8(195);
    }
  }
  encodeNumber(object) {
    if (!this.forceIntegerToFloat && Number.isSafeInteger(object)) {
      if (object >= 0) {
        if (object < 128) {
          this.writeU8(object);
        } else if (object < 256) {
          this.writeU8(204);
          this.writeU8(object);
        } else if (object < 65536) {
          this.writeU8(205);
          this.writeU16(object);
        } else if (object < 4294967296) {
          this.writeU8(206);
          this.writeU32(object);
        } else if (!this.useBigInt64) {
          this.writeU8(207);
          this.writeU64(object);
        } else {
          this.encodeNumberAsFloat(object);
        }
      } else {
        if (object >= -32) {
          this.writeU8(224 | object + 32);
        } else if (object >= -128) {
          this.writeU8(208);
          this.writeI8(object);
        } else if (object >= -32768) {
          this.writeU8(209);
          this.writeI16(object);
        } else if (object >= -2147483648) {
          this.writeU8(210);
          this.writeI32(object);
        } else if (!this.useBigInt64) {
          this.writeU8(211);
          this.writeI64(object);
        } else {
          this.encodeNumberAsFloat(object);
        }
      }
    } else {
      this.encodeNumberAsFloat(object);
    }
  }
  encodeNumberAsFloat(object) {
    if (this.forceFloat32) {
      this.writeU8(202);
      this.writeF32(object);
    } else {
      this.writeU8(203);
      this.writeF64(object);
    }
  }
  encodeBigInt64(object) {
    if (object >= BigInt(0)) {
      this.writeU8(207);
      this.writeBigUint64(object);
    } else {
      this.writeU8(211);
      this.writeBigInt64(object);
    }
  }
  writeStringHeader(byteLength) {
    if (byteLength < 32) {
      this.writeU8(160 + byteLength);
    } else if (byteLength < 256) {
      this.writeU8(217);
      this.writeU8(byteLength);
    } else if (byteLength < 65536) {
      this.writeU8(218);
      this.writeU16(byteLength);
    } else if (byteLength < 4294967296) {
      this.writeU8(219);
      this.writeU32(byteLength);
    } else {
      throw new Error(`Too long string: ${byteLength} bytes in UTF-8`);
    }
  }
  encodeString(object) {
    const maxHeaderSize = 1 + 4;
    const byteLength = utf8Count(object);
    this.ensureBufferSizeToWrite(maxHeaderSize + byteLength);
    this.writeStringHeader(byteLength);
    utf8Encode(object, this.bytes, this.pos);
    this.pos += byteLength;
  }
  encodeObject(object, depth) {
    const ext = this.extensionCodec.tryToEncode(object, this.context);
    if (ext != null) {
      this.encodeExtension(ext);
    } else if (Array.isArray(object)) {
      this.encodeArray(object, depth);
    } else if (ArrayBuffer.isView(object)) {
      this.encodeBinary(object);
    } else if (typeof object === "object") {
      this.encodeMap(object, depth);
    } else {
      throw new Error(`Unrecognized object: ${Object.prototype.toString.apply(object)}`);
    }
  }
  encodeBinary(object) {
    const size = object.byteLength;
    if (size < 256) {
      this.writeU8(196);
      this.writeU8(size);
    } else if (size < 65536) {
      this.writeU8(197);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(198);
      this.writeU32(size);
    } else {
      throw new Error(`Too large binary: ${size}`);
    }
    const bytes = ensureUint8Array(object);
    this.writeU8a(bytes);
  }
  encodeArray(object, depth) {
    const size = object.length;
    if (size < 16) {
      this.writeU8(144 + size);
    } else if (size < 65536) {
      this.writeU8(220);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(221);
      this.writeU32(size);
    } else {
      throw new Error(`Too large array: ${size}`);
    }
    for (const item of object) {
      this.doEncode(item, depth + 1);
    }
  }
  countWithoutUndefined(object, keys) {
    let count = 0;
    for (const key of keys) {
      if (object[key] !== void 0) {
        count++;
      }
    }
    return count;
  }
  encodeMap(object, depth) {
    const keys = Object.keys(object);
    if (this.sortKeys) {
      keys.sort();
    }
    const size = this.ignoreUndefined ? this.countWithoutUndefined(object, keys) : keys.length;
    if (size < 16) {
      this.writeU8(128 + size);
    } else if (size < 65536) {
      this.writeU8(222);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(223);
      this.writeU32(size);
    } else {
      throw new Error(`Too large map object: ${size}`);
    }
    for (const key of keys) {
      const value = object[key];
      if (!(this.ignoreUndefined && value === void 0)) {
        this.encodeString(key);
        this.doEncode(value, depth + 1);
      }
    }
  }
  encodeExtension(ext) {
    if (typeof ext.data === "function") {
      const data = ext.data(this.pos + 6);
      const size2 = data.length;
      if (size2 >= 4294967296) {
        throw new Error(`Too large extension object: ${size2}`);
      }
      this.writeU8(201);
      this.writeU32(size2);
      this.writeI8(ext.type);
      this.writeU8a(data);
      return;
    }
    const size = ext.data.length;
    if (size === 1) {
      this.writeU8(212);
    } else if (size === 2) {
      this.writeU8(213);
    } else if (size === 4) {
      this.writeU8(214);
    } else if (size === 8) {
      this.writeU8(215);
    } else if (size === 16) {
      this.writeU8(216);
    } else if (size < 256) {
      this.writeU8(199);
      this.writeU8(size);
    } else if (size < 65536) {
      this.writeU8(200);
      this.writeU16(size);
    } else if (size < 4294967296) {
      this.writeU8(201);
      this.writeU32(size);
    } else {
      throw new Error(`Too large extension object: ${size}`);
    }
    this.writeI8(ext.type);
    this.writeU8a(ext.data);
  }
  writeU8(value) {
    this.ensureBufferSizeToWrite(1);
    this.view.setUint8(this.pos, value);
    this.pos++;
  }
  writeU8a(values) {
    const size = values.length;
    this.ensureBufferSizeToWrite(size);
    this.bytes.set(values, this.pos);
    this.pos += size;
  }
  writeI8(value) {
    this.ensureBufferSizeToWrite(1);
    this.view.setInt8(this.pos, value);
    this.pos++;
  }
  writeU16(value) {
    this.ensureBufferSizeToWrite(2);
    this.view.setUint16(this.pos, value);
    this.pos += 2;
  }
  writeI16(value) {
    this.ensureBufferSizeToWrite(2);
    this.view.setInt16(this.pos, value);
    this.pos += 2;
  }
  writeU32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setUint32(this.pos, value);
    this.pos += 4;
  }
  writeI32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setInt32(this.pos, value);
    this.pos += 4;
  }
  writeF32(value) {
    this.ensureBufferSizeToWrite(4);
    this.view.setFloat32(this.pos, value);
    this.pos += 4;
  }
  writeF64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setFloat64(this.pos, value);
    this.pos += 8;
  }
  writeU64(value) {
    this.ensureBufferSizeToWrite(8);
    setUint64(this.view, this.pos, value);
    this.pos += 8;
  }
  writeI64(value) {
    this.ensureBufferSizeToWrite(8);
    setInt64(this.view, this.pos, value);
    this.pos += 8;
  }
  writeBigUint64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setBigUint64(this.pos, value);
    this.pos += 8;
  }
  writeBigInt64(value) {
    this.ensureBufferSizeToWrite(8);
    this.view.setBigInt64(this.pos, value);
    this.pos += 8;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/encode.mjs
function encode(value, options) {
  const encoder2 = new Encoder(options);
  return encoder2.encodeSharedRef(value);
}

// node_modules/@msgpack/msgpack/dist.esm/utils/prettyByte.mjs
function prettyByte(byte) {
  return `${byte < 0 ? "-" : ""}0x${Math.abs(byte).toString(16).padStart(2, "0")}`;
}

// node_modules/@msgpack/msgpack/dist.esm/CachedKeyDecoder.mjs
var DEFAULT_MAX_KEY_LENGTH = 16;
var DEFAULT_MAX_LENGTH_PER_KEY = 16;
var CachedKeyDecoder = class {
  hit = 0;
  miss = 0;
  caches;
  maxKeyLength;
  maxLengthPerKey;
  constructor(maxKeyLength = DEFAULT_MAX_KEY_LENGTH, maxLengthPerKey = DEFAULT_MAX_LENGTH_PER_KEY) {
    this.maxKeyLength = maxKeyLength;
    this.maxLengthPerKey = maxLengthPerKey;
    this.caches = [];
    for (let i = 0; i < this.maxKeyLength; i++) {
      this.caches.push([]);
    }
  }
  canBeCached(byteLength) {
    return byteLength > 0 && byteLength <= this.maxKeyLength;
  }
  find(bytes, inputOffset, byteLength) {
    const records = this.caches[byteLength - 1];
    FIND_CHUNK: for (const record of records) {
      const recordBytes = record.bytes;
      for (let j = 0; j < byteLength; j++) {
        if (recordBytes[j] !== bytes[inputOffset + j]) {
          continue FIND_CHUNK;
        }
      }
      return record.str;
    }
    return null;
  }
  store(bytes, value) {
    const records = this.caches[bytes.length - 1];
    const record = { bytes, str: value };
    if (records.length >= this.maxLengthPerKey) {
      records[Math.random() * records.length | 0] = record;
    } else {
      records.push(record);
    }
  }
  decode(bytes, inputOffset, byteLength) {
    const cachedValue = this.find(bytes, inputOffset, byteLength);
    if (cachedValue != null) {
      this.hit++;
      return cachedValue;
    }
    this.miss++;
    const str2 = utf8DecodeJs(bytes, inputOffset, byteLength);
    const slicedCopyOfBytes = Uint8Array.prototype.slice.call(bytes, inputOffset, inputOffset + byteLength);
    this.store(slicedCopyOfBytes, str2);
    return str2;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/Decoder.mjs
var STATE_ARRAY = "array";
var STATE_MAP_KEY = "map_key";
var STATE_MAP_VALUE = "map_value";
var mapKeyConverter = (key) => {
  if (typeof key === "string" || typeof key === "number") {
    return key;
  }
  throw new DecodeError("The type of key must be string or number but " + typeof key);
};
var StackPool = class {
  stack = [];
  stackHeadPosition = -1;
  get length() {
    return this.stackHeadPosition + 1;
  }
  top() {
    return this.stack[this.stackHeadPosition];
  }
  pushArrayState(size) {
    const state = this.getUninitializedStateFromPool();
    state.type = STATE_ARRAY;
    state.position = 0;
    state.size = size;
    state.array = new Array(size);
  }
  pushMapState(size) {
    const state = this.getUninitializedStateFromPool();
    state.type = STATE_MAP_KEY;
    state.readCount = 0;
    state.size = size;
    state.map = {};
  }
  getUninitializedStateFromPool() {
    this.stackHeadPosition++;
    if (this.stackHeadPosition === this.stack.length) {
      const partialState = {
        type: void 0,
        size: 0,
        array: void 0,
        position: 0,
        readCount: 0,
        map: void 0,
        key: null
      };
      this.stack.push(partialState);
    }
    return this.stack[this.stackHeadPosition];
  }
  release(state) {
    const topStackState = this.stack[this.stackHeadPosition];
    if (topStackState !== state) {
      throw new Error("Invalid stack state. Released state is not on top of the stack.");
    }
    if (state.type === STATE_ARRAY) {
      const partialState = state;
      partialState.size = 0;
      partialState.array = void 0;
      partialState.position = 0;
      partialState.type = void 0;
    }
    if (state.type === STATE_MAP_KEY || state.type === STATE_MAP_VALUE) {
      const partialState = state;
      partialState.size = 0;
      partialState.map = void 0;
      partialState.readCount = 0;
      partialState.type = void 0;
    }
    this.stackHeadPosition--;
  }
  reset() {
    this.stack.length = 0;
    this.stackHeadPosition = -1;
  }
};
var HEAD_BYTE_REQUIRED = -1;
var EMPTY_VIEW = new DataView(new ArrayBuffer(0));
var EMPTY_BYTES = new Uint8Array(EMPTY_VIEW.buffer);
try {
  EMPTY_VIEW.getInt8(0);
} catch (e) {
  if (!(e instanceof RangeError)) {
    throw new Error("This module is not supported in the current JavaScript engine because DataView does not throw RangeError on out-of-bounds access");
  }
}
var MORE_DATA = new RangeError("Insufficient data");
var sharedCachedKeyDecoder = new CachedKeyDecoder();
var Decoder = class _Decoder {
  extensionCodec;
  context;
  useBigInt64;
  rawStrings;
  maxStrLength;
  maxBinLength;
  maxArrayLength;
  maxMapLength;
  maxExtLength;
  keyDecoder;
  mapKeyConverter;
  totalPos = 0;
  pos = 0;
  view = EMPTY_VIEW;
  bytes = EMPTY_BYTES;
  headByte = HEAD_BYTE_REQUIRED;
  stack = new StackPool();
  entered = false;
  constructor(options) {
    this.extensionCodec = options?.extensionCodec ?? ExtensionCodec.defaultCodec;
    this.context = options?.context;
    this.useBigInt64 = options?.useBigInt64 ?? false;
    this.rawStrings = options?.rawStrings ?? false;
    this.maxStrLength = options?.maxStrLength ?? UINT32_MAX;
    this.maxBinLength = options?.maxBinLength ?? UINT32_MAX;
    this.maxArrayLength = options?.maxArrayLength ?? UINT32_MAX;
    this.maxMapLength = options?.maxMapLength ?? UINT32_MAX;
    this.maxExtLength = options?.maxExtLength ?? UINT32_MAX;
    this.keyDecoder = options?.keyDecoder !== void 0 ? options.keyDecoder : sharedCachedKeyDecoder;
    this.mapKeyConverter = options?.mapKeyConverter ?? mapKeyConverter;
  }
  clone() {
    return new _Decoder({
      extensionCodec: this.extensionCodec,
      context: this.context,
      useBigInt64: this.useBigInt64,
      rawStrings: this.rawStrings,
      maxStrLength: this.maxStrLength,
      maxBinLength: this.maxBinLength,
      maxArrayLength: this.maxArrayLength,
      maxMapLength: this.maxMapLength,
      maxExtLength: this.maxExtLength,
      keyDecoder: this.keyDecoder
    });
  }
  reinitializeState() {
    this.totalPos = 0;
    this.headByte = HEAD_BYTE_REQUIRED;
    this.stack.reset();
  }
  setBuffer(buffer) {
    const bytes = ensureUint8Array(buffer);
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  appendBuffer(buffer) {
    if (this.headByte === HEAD_BYTE_REQUIRED && !this.hasRemaining(1)) {
      this.setBuffer(buffer);
    } else {
      const remainingData = this.bytes.subarray(this.pos);
      const newData = ensureUint8Array(buffer);
      const newBuffer = new Uint8Array(remainingData.length + newData.length);
      newBuffer.set(remainingData);
      newBuffer.set(newData, remainingData.length);
      this.setBuffer(newBuffer);
    }
  }
  hasRemaining(size) {
    return this.view.byteLength - this.pos >= size;
  }
  createExtraByteError(posToShow) {
    const { view, pos } = this;
    return new RangeError(`Extra ${view.byteLength - pos} of ${view.byteLength} byte(s) found at buffer[${posToShow}]`);
  }
  /**
   * @throws {@link DecodeError}
   * @throws {@link RangeError}
   */
  decode(buffer) {
    if (this.entered) {
      const instance = this.clone();
      return instance.decode(buffer);
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.setBuffer(buffer);
      const object = this.doDecodeSync();
      if (this.hasRemaining(1)) {
        throw this.createExtraByteError(this.pos);
      }
      return object;
    } finally {
      this.entered = false;
    }
  }
  *decodeMulti(buffer) {
    if (this.entered) {
      const instance = this.clone();
      yield* instance.decodeMulti(buffer);
      return;
    }
    try {
      this.entered = true;
      this.reinitializeState();
      this.setBuffer(buffer);
      while (this.hasRemaining(1)) {
        yield this.doDecodeSync();
      }
    } finally {
      this.entered = false;
    }
  }
  async decodeAsync(stream) {
    if (this.entered) {
      const instance = this.clone();
      return instance.decodeAsync(stream);
    }
    try {
      this.entered = true;
      let decoded = false;
      let object;
      for await (const buffer of stream) {
        if (decoded) {
          this.entered = false;
          throw this.createExtraByteError(this.totalPos);
        }
        this.appendBuffer(buffer);
        try {
          object = this.doDecodeSync();
          decoded = true;
        } catch (e) {
          if (!(e instanceof RangeError)) {
            throw e;
          }
        }
        this.totalPos += this.pos;
      }
      if (decoded) {
        if (this.hasRemaining(1)) {
          throw this.createExtraByteError(this.totalPos);
        }
        return object;
      }
      const { headByte, pos, totalPos } = this;
      throw new RangeError(`Insufficient data in parsing ${prettyByte(headByte)} at ${totalPos} (${pos} in the current buffer)`);
    } finally {
      this.entered = false;
    }
  }
  decodeArrayStream(stream) {
    return this.decodeMultiAsync(stream, true);
  }
  decodeStream(stream) {
    return this.decodeMultiAsync(stream, false);
  }
  async *decodeMultiAsync(stream, isArray) {
    if (this.entered) {
      const instance = this.clone();
      yield* instance.decodeMultiAsync(stream, isArray);
      return;
    }
    try {
      this.entered = true;
      let isArrayHeaderRequired = isArray;
      let arrayItemsLeft = -1;
      for await (const buffer of stream) {
        if (isArray && arrayItemsLeft === 0) {
          throw this.createExtraByteError(this.totalPos);
        }
        this.appendBuffer(buffer);
        if (isArrayHeaderRequired) {
          arrayItemsLeft = this.readArraySize();
          isArrayHeaderRequired = false;
          this.complete();
        }
        try {
          while (true) {
            yield this.doDecodeSync();
            if (--arrayItemsLeft === 0) {
              break;
            }
          }
        } catch (e) {
          if (!(e instanceof RangeError)) {
            throw e;
          }
        }
        this.totalPos += this.pos;
      }
    } finally {
      this.entered = false;
    }
  }
  doDecodeSync() {
    DECODE: while (true) {
      const headByte = this.readHeadByte();
      let object;
      if (headByte >= 224) {
        object = headByte - 256;
      } else if (headByte < 192) {
        if (headByte < 128) {
          object = headByte;
        } else if (headByte < 144) {
          const size = headByte - 128;
          if (size !== 0) {
            this.pushMapState(size);
            this.complete();
            continue DECODE;
          } else {
            object = {};
          }
        } else if (headByte < 160) {
          const size = headByte - 144;
          if (size !== 0) {
            this.pushArrayState(size);
            this.complete();
            continue DECODE;
          } else {
            object = [];
          }
        } else {
          const byteLength = headByte - 160;
          object = this.decodeString(byteLength, 0);
        }
      } else if (headByte === 192) {
        object = null;
      } else if (headByte === 194) {
        object = false;
      } else if (headByte === 195) {
        object = true;
      } else if (headByte === 202) {
        object = this.readF32();
      } else if (headByte === 203) {
        object = this.readF64();
      } else if (headByte === 204) {
        object = this.readU8();
      } else if (headByte === 205) {
        object = this.readU16();
      } else if (headByte === 206) {
        object = this.readU32();
      } else if (headByte === 207) {
        if (this.useBigInt64) {
          object = this.readU64AsBigInt();
        } else {
          object = this.readU64();
        }
      } else if (headByte === 208) {
        object = this.readI8();
      } else if (headByte === 209) {
        object = this.readI16();
      } else if (headByte === 210) {
        object = this.readI32();
      } else if (headByte === 211) {
        if (this.useBigInt64) {
          object = this.readI64AsBigInt();
        } else {
          object = this.readI64();
        }
      } else if (headByte === 217) {
        const byteLength = this.lookU8();
        object = this.decodeString(byteLength, 1);
      } else if (headByte === 218) {
        const byteLength = this.lookU16();
        object = this.decodeString(byteLength, 2);
      } else if (headByte === 219) {
        const byteLength = this.lookU32();
        object = this.decodeString(byteLength, 4);
      } else if (headByte === 220) {
        const size = this.readU16();
        if (size !== 0) {
          this.pushArrayState(size);
          this.complete();
          continue DECODE;
        } else {
          object = [];
        }
      } else if (headByte === 221) {
        const size = this.readU32();
        if (size !== 0) {
          this.pushArrayState(size);
          this.complete();
          continue DECODE;
        } else {
          object = [];
        }
      } else if (headByte === 222) {
        const size = this.readU16();
        if (size !== 0) {
          this.pushMapState(size);
          this.complete();
          continue DECODE;
        } else {
          object = {};
        }
      } else if (headByte === 223) {
        const size = this.readU32();
        if (size !== 0) {
          this.pushMapState(size);
          this.complete();
          continue DECODE;
        } else {
          object = {};
        }
      } else if (headByte === 196) {
        const size = this.lookU8();
        object = this.decodeBinary(size, 1);
      } else if (headByte === 197) {
        const size = this.lookU16();
        object = this.decodeBinary(size, 2);
      } else if (headByte === 198) {
        const size = this.lookU32();
        object = this.decodeBinary(size, 4);
      } else if (headByte === 212) {
        object = this.decodeExtension(1, 0);
      } else if (headByte === 213) {
        object = this.decodeExtension(2, 0);
      } else if (headByte === 214) {
        object = this.decodeExtension(4, 0);
      } else if (headByte === 215) {
        object = this.decodeExtension(8, 0);
      } else if (headByte === 216) {
        object = this.decodeExtension(16, 0);
      } else if (headByte === 199) {
        const size = this.lookU8();
        object = this.decodeExtension(size, 1);
      } else if (headByte === 200) {
        const size = this.lookU16();
        object = this.decodeExtension(size, 2);
      } else if (headByte === 201) {
        const size = this.lookU32();
        object = this.decodeExtension(size, 4);
      } else {
        throw new DecodeError(`Unrecognized type byte: ${prettyByte(headByte)}`);
      }
      this.complete();
      const stack = this.stack;
      while (stack.length > 0) {
        const state = stack.top();
        if (state.type === STATE_ARRAY) {
          state.array[state.position] = object;
          state.position++;
          if (state.position === state.size) {
            object = state.array;
            stack.release(state);
          } else {
            continue DECODE;
          }
        } else if (state.type === STATE_MAP_KEY) {
          if (object === "__proto__") {
            throw new DecodeError("The key __proto__ is not allowed");
          }
          state.key = this.mapKeyConverter(object);
          state.type = STATE_MAP_VALUE;
          continue DECODE;
        } else {
          state.map[state.key] = object;
          state.readCount++;
          if (state.readCount === state.size) {
            object = state.map;
            stack.release(state);
          } else {
            state.key = null;
            state.type = STATE_MAP_KEY;
            continue DECODE;
          }
        }
      }
      return object;
    }
  }
  readHeadByte() {
    if (this.headByte === HEAD_BYTE_REQUIRED) {
      this.headByte = this.readU8();
    }
    return this.headByte;
  }
  complete() {
    this.headByte = HEAD_BYTE_REQUIRED;
  }
  readArraySize() {
    const headByte = this.readHeadByte();
    switch (headByte) {
      case 220:
        return this.readU16();
      case 221:
        return this.readU32();
      default: {
        if (headByte < 160) {
          return headByte - 144;
        } else {
          throw new DecodeError(`Unrecognized array type byte: ${prettyByte(headByte)}`);
        }
      }
    }
  }
  pushMapState(size) {
    if (size > this.maxMapLength) {
      throw new DecodeError(`Max length exceeded: map length (${size}) > maxMapLengthLength (${this.maxMapLength})`);
    }
    this.stack.pushMapState(size);
  }
  pushArrayState(size) {
    if (size > this.maxArrayLength) {
      throw new DecodeError(`Max length exceeded: array length (${size}) > maxArrayLength (${this.maxArrayLength})`);
    }
    this.stack.pushArrayState(size);
  }
  decodeString(byteLength, headerOffset) {
    if (!this.rawStrings || this.stateIsMapKey()) {
      return this.decodeUtf8String(byteLength, headerOffset);
    }
    return this.decodeBinary(byteLength, headerOffset);
  }
  /**
   * @throws {@link RangeError}
   */
  decodeUtf8String(byteLength, headerOffset) {
    if (byteLength > this.maxStrLength) {
      throw new DecodeError(`Max length exceeded: UTF-8 byte length (${byteLength}) > maxStrLength (${this.maxStrLength})`);
    }
    if (this.bytes.byteLength < this.pos + headerOffset + byteLength) {
      throw MORE_DATA;
    }
    const offset = this.pos + headerOffset;
    let object;
    if (this.stateIsMapKey() && this.keyDecoder?.canBeCached(byteLength)) {
      object = this.keyDecoder.decode(this.bytes, offset, byteLength);
    } else {
      object = utf8Decode(this.bytes, offset, byteLength);
    }
    this.pos += headerOffset + byteLength;
    return object;
  }
  stateIsMapKey() {
    if (this.stack.length > 0) {
      const state = this.stack.top();
      return state.type === STATE_MAP_KEY;
    }
    return false;
  }
  /**
   * @throws {@link RangeError}
   */
  decodeBinary(byteLength, headOffset) {
    if (byteLength > this.maxBinLength) {
      throw new DecodeError(`Max length exceeded: bin length (${byteLength}) > maxBinLength (${this.maxBinLength})`);
    }
    if (!this.hasRemaining(byteLength + headOffset)) {
      throw MORE_DATA;
    }
    const offset = this.pos + headOffset;
    const object = this.bytes.subarray(offset, offset + byteLength);
    this.pos += headOffset + byteLength;
    return object;
  }
  decodeExtension(size, headOffset) {
    if (size > this.maxExtLength) {
      throw new DecodeError(`Max length exceeded: ext length (${size}) > maxExtLength (${this.maxExtLength})`);
    }
    const extType = this.view.getInt8(this.pos + headOffset);
    const data = this.decodeBinary(
      size,
      headOffset + 1
      /* extType */
    );
    return this.extensionCodec.decode(data, extType, this.context);
  }
  lookU8() {
    return this.view.getUint8(this.pos);
  }
  lookU16() {
    return this.view.getUint16(this.pos);
  }
  lookU32() {
    return this.view.getUint32(this.pos);
  }
  readU8() {
    const value = this.view.getUint8(this.pos);
    this.pos++;
    return value;
  }
  readI8() {
    const value = this.view.getInt8(this.pos);
    this.pos++;
    return value;
  }
  readU16() {
    const value = this.view.getUint16(this.pos);
    this.pos += 2;
    return value;
  }
  readI16() {
    const value = this.view.getInt16(this.pos);
    this.pos += 2;
    return value;
  }
  readU32() {
    const value = this.view.getUint32(this.pos);
    this.pos += 4;
    return value;
  }
  readI32() {
    const value = this.view.getInt32(this.pos);
    this.pos += 4;
    return value;
  }
  readU64() {
    const value = getUint64(this.view, this.pos);
    this.pos += 8;
    return value;
  }
  readI64() {
    const value = getInt64(this.view, this.pos);
    this.pos += 8;
    return value;
  }
  readU64AsBigInt() {
    const value = this.view.getBigUint64(this.pos);
    this.pos += 8;
    return value;
  }
  readI64AsBigInt() {
    const value = this.view.getBigInt64(this.pos);
    this.pos += 8;
    return value;
  }
  readF32() {
    const value = this.view.getFloat32(this.pos);
    this.pos += 4;
    return value;
  }
  readF64() {
    const value = this.view.getFloat64(this.pos);
    this.pos += 8;
    return value;
  }
};

// node_modules/@msgpack/msgpack/dist.esm/decode.mjs
function decode(buffer, options) {
  const decoder2 = new Decoder(options);
  return decoder2.decode(buffer);
}

// src/content.ts
function tryDecode(content) {
  try {
    return decode(content, { useBigInt64: true });
  } catch {
    return void 0;
  }
}
function isMap(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Uint8Array);
}
function big(v) {
  if (typeof v === "bigint") return v;
  if (typeof v === "number" && Number.isSafeInteger(v)) return BigInt(v);
  return null;
}
function encodeMediaContent(media) {
  const map = { key: media.key };
  if (media.name !== void 0) map.name = media.name;
  if (media.size !== void 0) map.size = media.size;
  if (media.type !== void 0) map.type = media.type;
  return encode(map);
}
function decodeMediaContent(content) {
  const v = tryDecode(content);
  if (!isMap(v) || typeof v.key !== "string") return null;
  const out = { key: v.key };
  if (typeof v.name === "string") out.name = v.name;
  const size = big(v.size);
  if (size !== null) out.size = Number(size);
  if (typeof v.type === "string") out.type = v.type;
  return out;
}
function decodeSystemContent(content) {
  const v = tryDecode(content);
  if (!isMap(v) || typeof v.event !== "string") return null;
  const uids = Array.isArray(v.uids) ? v.uids.map(big).filter((u) => u !== null) : [];
  const out = { event: v.event, by: big(v.by) ?? 0n, uids };
  if (typeof v.title === "string") out.title = v.title;
  if (typeof v.text === "string") out.text = v.text;
  if ("data" in v) out.data = v.data;
  return out;
}
function recalledSeq(content) {
  const v = tryDecode(content);
  return Array.isArray(v) && v.length >= 1 ? big(v[0]) : null;
}

// src/protocol/ids.ts
var MAX_U64 = (1n << 64n) - 1n;
function toU64(value, what = "id", min = 0n) {
  let big2;
  if (typeof value === "bigint") {
    big2 = value;
  } else if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) {
      throw new RangeError(`${what} must be an integer (a bigint above 2^53), got ${value}`);
    }
    big2 = BigInt(value);
  } else if (typeof value === "string" && /^[0-9]{1,20}$/.test(value)) {
    big2 = BigInt(value);
  } else {
    throw new TypeError(`${what} must be a bigint, a safe integer or a decimal string`);
  }
  if (big2 < min || big2 > MAX_U64) {
    throw new RangeError(`${what} must be in ${min}..2^64-1, got ${big2}`);
  }
  return big2;
}
function toId(value, what = "id") {
  return toU64(value, what, 1n);
}
function wireU64(value) {
  return value < 0x100000000n ? Number(value) : value;
}

// src/protocol/ops.ts
var PROTOCOL_VERSION = 1;
var Op = {
  LOGIN: 1,
  LOGIN_OK: 2,
  PING: 3,
  PONG: 4,
  SEND: 10,
  SEND_ACK: 11,
  PUSH: 20,
  DELIVERED: 21,
  READ: 22,
  READ_NOTIFY: 23,
  TYPING: 24,
  TYPING_NOTIFY: 25,
  PRESENCE: 26,
  PRESENCE_RESULT: 27,
  SYNC: 30,
  SYNC_RESULT: 31,
  PULL: 32,
  PULL_RESULT: 33,
  HISTORY: 34,
  HISTORY_RESULT: 35,
  SYNC_HINT: 36,
  NOTICE: 37,
  RECALL: 40,
  RECALL_OK: 41,
  OPEN_P2P: 50,
  CONV_OK: 51,
  GROUP_CREATE: 52,
  GROUP_MEMBERS: 54,
  OK: 55,
  GROUP_INFO: 56,
  GROUP_INFO_RESULT: 57,
  KICK: 60,
  LOGOUT: 62,
  MEDIA_UPLOAD: 70,
  MEDIA_URL: 71,
  MEDIA_GET: 72,
  PUSH_REGISTER: 80,
  PUSH_REGISTER_OK: 81,
  PUSH_UNREGISTER: 82,
  MUTE: 84,
  ERROR: 127
};
var ErrorCode = {
  BAD_FRAME: 1,
  FRAME_TOO_LARGE: 2,
  UNKNOWN_OP: 3,
  BAD_REQUEST: 4,
  NOT_LOGGED_IN: 10,
  AUTH_FAILED: 11,
  VERSION_UNSUPPORTED: 12,
  NOT_MEMBER: 20,
  NO_SUCH_CONVERSATION: 21,
  CONTENT_TOO_LARGE: 22,
  BAD_MSG_TYPE: 23,
  RATE_LIMITED: 24,
  RECALL_DENIED: 25,
  IDEMPOTENCY_CONFLICT: 26,
  FORBIDDEN: 27,
  NO_SUCH_MESSAGE: 28,
  UNAVAILABLE: 30,
  INTERNAL: 31,
  OUTCOME_UNKNOWN: 32,
  CONTENT_DENIED: 33
};
var KickReason = {
  DUPLICATE_LOGIN: 1,
  DRAINING: 2,
  AUTH_REVOKED: 3,
  SLOW_CONSUMER: 4,
  SHUTDOWN: 5
};
var MsgType = {
  TEXT: 1,
  IMAGE: 2,
  VOICE: 3,
  FILE: 4,
  RECALL: 5,
  SYSTEM: 6
};
var CAPS = ["outcome_unknown", "content_denied"];
function nameOf(table, value) {
  for (const [name, v] of Object.entries(table)) {
    if (v === value) return name.toLowerCase();
  }
  return void 0;
}
function codeName(code) {
  if (code === 0) return "client";
  return nameOf(ErrorCode, code) ?? `error ${code}`;
}
function kickName(reason) {
  return nameOf(KickReason, reason) ?? `reason ${reason}`;
}

// src/protocol/frames.ts
var ProtocolError = class extends Error {
  name = "ProtocolError";
};
var decoder = new Decoder({ useBigInt64: true });
var utf8 = new TextDecoder("utf-8", { fatal: false });
function fail(what) {
  throw new ProtocolError(what);
}
function arr(v, what) {
  return Array.isArray(v) ? v : fail(`${what}: expected an array`);
}
function int(v, what) {
  if (typeof v === "number" && Number.isInteger(v)) return v;
  if (typeof v === "bigint" && v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= 0n) return Number(v);
  return fail(`${what}: expected an integer`);
}
function u64(v, what) {
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
  if (typeof v === "bigint" && v >= 0n) return v;
  return fail(`${what}: expected an unsigned integer`);
}
function str(v, what) {
  return typeof v === "string" ? v : fail(`${what}: expected a string`);
}
function bin(v, what) {
  return v instanceof Uint8Array ? v.slice() : fail(`${what}: expected bin`);
}
function bool(v, what) {
  return typeof v === "boolean" ? v : fail(`${what}: expected a bool`);
}
function opaque(v, what) {
  if (v instanceof Uint8Array) return v.slice();
  if (typeof v === "number" || typeof v === "bigint" || typeof v === "string") return v;
  return fail(`${what}: expected an opaque position`);
}
function at(a, i, what) {
  return i < a.length ? a[i] : fail(`${what}: ${a.length} elements, field ${i} missing`);
}
function textOf(msgType, content) {
  return msgType === MsgType.TEXT ? utf8.decode(content) : null;
}
function message(convId, f, base, what) {
  const msgType = int(at(f, base + 3, what), `${what} msg_type`);
  const content = bin(at(f, base + 4, what), `${what} content`);
  return {
    convId,
    seq: u64(at(f, base, what), `${what} seq`),
    msgId: u64(at(f, base + 1, what), `${what} msg_id`),
    senderUid: u64(at(f, base + 2, what), `${what} sender_uid`),
    msgType,
    content,
    serverMs: int(at(f, base + 5, what), `${what} server_ms`),
    clientMsgId: str(at(f, base + 6, what), `${what} client_msg_id`),
    text: textOf(msgType, content)
  };
}
function messages(convId, v, what) {
  return arr(v, what).map((m, i) => message(convId, arr(m, `${what}[${i}]`), 0, `${what}[${i}]`));
}
function conv(v, what) {
  const c = arr(v, what);
  return {
    convId: u64(at(c, 0, what), `${what} conv_id`),
    kind: int(at(c, 1, what), `${what} kind`),
    maxSeq: u64(at(c, 2, what), `${what} max_seq`),
    readSeq: u64(at(c, 3, what), `${what} read_seq`),
    deliveredSeq: u64(at(c, 4, what), `${what} delivered_seq`),
    unread: int(at(c, 5, what), `${what} unread`),
    lastActiveMs: int(at(c, 6, what), `${what} last_active_ms`),
    isMember: bool(at(c, 7, what), `${what} is_member`)
  };
}
function syncPartial(v, w) {
  if (v === null || typeof v !== "object" || Array.isArray(v) || v instanceof Uint8Array) return {};
  const m = v;
  return { partial: { missing: int(m.missing, `${w} partial.missing`), servers: int(m.servers, `${w} partial.servers`) } };
}
function uidList(v, what) {
  return arr(v, what).map((u) => u64(u, what));
}
function decodeServerFrame(body2) {
  let value;
  try {
    value = decoder.decode(body2);
  } catch (e) {
    throw new ProtocolError(`undecodable frame: ${e.message}`);
  }
  const f = arr(value, "frame");
  const op = int(at(f, 0, "frame"), "op");
  const rid = (i, what) => int(at(f, i, what), `${what} rid`);
  switch (op) {
    case Op.LOGIN_OK: {
      const w = "LOGIN_OK";
      const m = at(f, 2, w);
      if (m === null || typeof m !== "object" || Array.isArray(m) || m instanceof Uint8Array) {
        return fail(`${w}: expected a map`);
      }
      const map = m;
      return {
        kind: "login_ok",
        rid: rid(1, w),
        node: str(map.node, `${w} node`),
        hb: int(map.hb, `${w} hb`),
        idle: int(map.idle, `${w} idle`),
        maxFrame: int(map.max_frame, `${w} max_frame`),
        maxContent: int(map.max_content, `${w} max_content`),
        ts: int(map.ts, `${w} ts`)
      };
    }
    case Op.PONG:
      return { kind: "pong" };
    case Op.SEND_ACK: {
      const w = "SEND_ACK";
      return {
        kind: "send_ack",
        rid: rid(1, w),
        convId: u64(at(f, 2, w), `${w} conv_id`),
        seq: u64(at(f, 3, w), `${w} seq`),
        msgId: u64(at(f, 4, w), `${w} msg_id`),
        serverMs: int(at(f, 5, w), `${w} server_ms`)
      };
    }
    case Op.PUSH: {
      const w = "PUSH";
      const convId = u64(at(f, 1, w), `${w} conv_id`);
      return { kind: "push", ...message(convId, f, 2, w) };
    }
    case Op.READ_NOTIFY: {
      const w = "READ_NOTIFY";
      return {
        kind: "read_notify",
        convId: u64(at(f, 1, w), `${w} conv_id`),
        readerUid: u64(at(f, 2, w), `${w} reader_uid`),
        seq: u64(at(f, 3, w), `${w} seq`)
      };
    }
    case Op.TYPING_NOTIFY: {
      const w = "TYPING_NOTIFY";
      return {
        kind: "typing_notify",
        convId: u64(at(f, 1, w), `${w} conv_id`),
        uid: u64(at(f, 2, w), `${w} uid`)
      };
    }
    case Op.PRESENCE_RESULT: {
      const w = "PRESENCE_RESULT";
      const entries = arr(at(f, 2, w), w).map((e) => {
        const pair = arr(e, w);
        const devices = arr(at(pair, 1, w), w).map((d) => str(d, `${w} device`));
        return [u64(at(pair, 0, w), `${w} uid`), devices];
      });
      return { kind: "presence_result", rid: rid(1, w), entries };
    }
    case Op.SYNC_RESULT: {
      const w = "SYNC_RESULT";
      return {
        kind: "sync_result",
        rid: rid(1, w),
        nextSince: opaque(at(f, 2, w), `${w} next_since`),
        nextCursor: opaque(at(f, 3, w), `${w} next_cursor`),
        hasMore: bool(at(f, 4, w), `${w} has_more`),
        convs: arr(at(f, 5, w), w).map((c, i) => conv(c, `${w} conv ${i}`)),
        ...syncPartial(f[6], w)
      };
    }
    case Op.PULL_RESULT:
    case Op.HISTORY_RESULT: {
      const w = op === Op.PULL_RESULT ? "PULL_RESULT" : "HISTORY_RESULT";
      const convId = u64(at(f, 2, w), `${w} conv_id`);
      return {
        kind: op === Op.PULL_RESULT ? "pull_result" : "history_result",
        rid: rid(1, w),
        convId,
        hasMore: bool(at(f, 3, w), `${w} has_more`),
        messages: messages(convId, at(f, 4, w), `${w} msgs`)
      };
    }
    case Op.SYNC_HINT:
      return { kind: "sync_hint" };
    case Op.NOTICE: {
      const w = "NOTICE";
      const msgType = int(at(f, 1, w), `${w} msg_type`);
      const content = bin(at(f, 2, w), `${w} content`);
      return {
        kind: "notice",
        msgType,
        content,
        serverMs: int(at(f, 3, w), `${w} server_ms`),
        text: textOf(msgType, content)
      };
    }
    case Op.RECALL_OK: {
      const w = "RECALL_OK";
      return {
        kind: "recall_ok",
        rid: rid(1, w),
        convId: u64(at(f, 2, w), `${w} conv_id`),
        recallSeq: u64(at(f, 3, w), `${w} recall_seq`)
      };
    }
    case Op.CONV_OK: {
      const w = "CONV_OK";
      return { kind: "conv_ok", rid: rid(1, w), convId: u64(at(f, 2, w), `${w} conv_id`) };
    }
    case Op.OK:
      return { kind: "ok", rid: rid(1, "OK") };
    case Op.GROUP_INFO_RESULT: {
      const w = "GROUP_INFO_RESULT";
      return {
        kind: "group_info_result",
        rid: rid(1, w),
        convId: u64(at(f, 2, w), `${w} conv_id`),
        title: str(at(f, 3, w), `${w} title`),
        ownerUid: u64(at(f, 4, w), `${w} owner_uid`),
        members: uidList(at(f, 5, w), `${w} uids`)
      };
    }
    case Op.KICK: {
      const w = "KICK";
      const reason = int(at(f, 1, w), `${w} reason`);
      return {
        kind: "kick",
        reason,
        reasonName: kickName(reason),
        text: str(at(f, 2, w), `${w} text`),
        reconnectHint: str(at(f, 3, w), `${w} reconnect_hint`)
      };
    }
    case Op.MEDIA_URL: {
      const w = "MEDIA_URL";
      return {
        kind: "media_url",
        rid: rid(1, w),
        key: str(at(f, 2, w), `${w} key`),
        url: str(at(f, 3, w), `${w} url`),
        expiresMs: int(at(f, 4, w), `${w} expires_ms`)
      };
    }
    case Op.PUSH_REGISTER_OK:
      return { kind: "push_register_ok", rid: rid(1, "PUSH_REGISTER_OK") };
    case Op.ERROR: {
      const w = "ERROR";
      const code = int(at(f, 2, w), `${w} code`);
      return {
        kind: "error",
        rid: rid(1, w),
        code,
        codeName: codeName(code),
        text: str(at(f, 3, w), `${w} text`)
      };
    }
    default:
      return { kind: "invalid", op };
  }
}
var encoder = new Encoder({ useBigInt64: true });
function body(value) {
  return encoder.encode(value);
}
function ids(values, what) {
  return Array.from(values, (v) => wireU64(toId(v, what)));
}
function opaqueOut(v) {
  return typeof v === "bigint" ? wireU64(v) : v;
}
function encodeLogin(rid, uid, device, token, caps) {
  const map = { v: PROTOCOL_VERSION, uid: wireU64(uid), device, token };
  if (caps.length) map.caps = [...caps];
  return body([Op.LOGIN, rid, map]);
}
var encodePing = () => body([Op.PING]);
var encodeLogout = () => body([Op.LOGOUT]);
function encodeSend(rid, convId, clientMsgId, msgType, content) {
  return body([Op.SEND, rid, wireU64(convId), clientMsgId, msgType, content]);
}
function encodeDelivered(convId, seq) {
  return body([Op.DELIVERED, wireU64(convId), wireU64(seq)]);
}
function encodeRead(convId, seq) {
  return body([Op.READ, wireU64(convId), wireU64(seq)]);
}
function encodeTyping(convId) {
  return body([Op.TYPING, wireU64(convId)]);
}
function encodePresence(rid, uids) {
  return body([Op.PRESENCE, rid, ids(uids, "uid")]);
}
function encodeSync(rid, since, cursor, limit) {
  return body([Op.SYNC, rid, opaqueOut(since), opaqueOut(cursor), limit]);
}
function encodePull(rid, convId, afterSeq, limit) {
  return body([Op.PULL, rid, wireU64(convId), wireU64(afterSeq), limit]);
}
function encodeHistory(rid, convId, beforeSeq, limit) {
  return body([Op.HISTORY, rid, wireU64(convId), wireU64(beforeSeq), limit]);
}
function encodeRecall(rid, convId, seq) {
  return body([Op.RECALL, rid, wireU64(convId), wireU64(seq)]);
}
function encodeOpenP2P(rid, peer) {
  return body([Op.OPEN_P2P, rid, wireU64(peer)]);
}
function encodeGroupCreate(rid, title, uids) {
  return body([Op.GROUP_CREATE, rid, title, ids(uids, "uid")]);
}
function encodeGroupMembers(rid, convId, add, remove) {
  return body([Op.GROUP_MEMBERS, rid, wireU64(convId), ids(add, "uid"), ids(remove, "uid")]);
}
function encodeGroupInfo(rid, convId) {
  return body([Op.GROUP_INFO, rid, wireU64(convId)]);
}
function encodeMediaUpload(rid, sha2562, size, contentType) {
  return body([Op.MEDIA_UPLOAD, rid, sha2562, wireU64(toU64(size, "size")), contentType]);
}
function encodeMediaGet(rid, key) {
  return body([Op.MEDIA_GET, rid, key]);
}
function encodePushRegister(rid, provider, token, opts) {
  const map = {};
  if (opts.preview !== void 0) map.preview = opts.preview;
  if (opts.locale !== void 0) map.locale = opts.locale;
  return body([Op.PUSH_REGISTER, rid, provider, token, map]);
}
function encodePushUnregister(rid) {
  return body([Op.PUSH_UNREGISTER, rid]);
}
function encodeMute(rid, convId, untilMs) {
  return body([Op.MUTE, rid, wireU64(convId), wireU64(untilMs)]);
}
function sameOpaque(a, b) {
  if (a instanceof Uint8Array && b instanceof Uint8Array) {
    return a.length === b.length && a.every((x, i) => x === b[i]);
  }
  if ((typeof a === "number" || typeof a === "bigint") && (typeof b === "number" || typeof b === "bigint")) {
    return BigInt(a) === BigInt(b);
  }
  return a === b;
}

// src/client/errors.ts
var ClientError = class extends Error {
  name = "ClientError";
  /** The server's ERROR code (ErrorCode), 0 when the request failed locally. */
  code;
  /** "auth_failed", "not_member"...; "client" for code 0. */
  codeName;
  /** The server's text (for people: do not parse it), or what failed locally. */
  text;
  constructor(code, text) {
    super(code ? `${codeName(code)}: ${text}` : text);
    this.code = code;
    this.codeName = codeName(code);
    this.text = text;
  }
};
var ConnectionLost = class extends ClientError {
  name = "ConnectionLost";
  constructor(text) {
    super(0, text);
  }
};
var SessionEnded = class extends ConnectionLost {
  name = "SessionEnded";
  /** The KICK that ended the session, if one did. */
  kick;
  constructor(text, kick = null) {
    super(text);
    this.kick = kick;
  }
};
var RequestTimeout = class extends ClientError {
  name = "RequestTimeout";
  constructor(text) {
    super(0, text);
  }
};

// src/transport/types.ts
var SCHEMES = /* @__PURE__ */ new Set(["tcp", "tls", "ws", "wss"]);
var DEFAULT_PORTS = { ws: 80, wss: 443 };
function parseEndpoint(spec, base) {
  let text = spec.trim();
  if (text.startsWith("/") && base !== void 0) {
    const page = new URL(text, base);
    text = `${page.protocol === "https:" ? "wss" : "ws"}://${page.host}${page.pathname}${page.search}`;
  } else if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(text)) {
    text = `tcp://${text}`;
  }
  let url;
  try {
    url = new URL(text);
  } catch {
    throw new TypeError(`bad gateway URL ${JSON.stringify(spec)}: expected tcp://host:port or ws://host:port/ws`);
  }
  const scheme = url.protocol.slice(0, -1).toLowerCase();
  if (!SCHEMES.has(scheme)) {
    throw new TypeError(`bad gateway URL ${JSON.stringify(spec)}: the scheme must be tcp, tls, ws or wss`);
  }
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
  const port = url.port ? Number(url.port) : DEFAULT_PORTS[scheme];
  if (!host || port === void 0) {
    throw new TypeError(`bad gateway URL ${JSON.stringify(spec)}: it needs a host and a port`);
  }
  const isWs = scheme === "ws" || scheme === "wss";
  const path = isWs ? `${url.pathname || "/"}${url.search}` : "";
  const hostPart = host.includes(":") ? `[${host}]` : host;
  return {
    scheme,
    host,
    port,
    path,
    url: `${scheme}://${hostPart}:${port}${path}`
  };
}
function hintEndpoint(current, hint) {
  if (!hint || current.scheme !== "tcp" && current.scheme !== "tls") return null;
  try {
    const ep = parseEndpoint(`${current.scheme}://${hint}`);
    return ep;
  } catch {
    return null;
  }
}

// src/client/emitter.ts
var Emitter = class {
  listeners = /* @__PURE__ */ new Map();
  /** Call `fn` on every `name` event; the function returned removes it. */
  on(name, fn) {
    let set = this.listeners.get(name);
    if (set === void 0) this.listeners.set(name, set = /* @__PURE__ */ new Set());
    set.add(fn);
    return () => this.off(name, fn);
  }
  /** Call `fn` on the next `name` event only. */
  once(name, fn) {
    const off = this.on(name, (payload) => {
      off();
      fn(payload);
    });
    return off;
  }
  off(name, fn) {
    this.listeners.get(name)?.delete(fn);
  }
  emit(name, payload) {
    const set = this.listeners.get(name);
    if (set === void 0 || set.size === 0) return;
    for (const fn of [...set]) {
      try {
        fn(payload);
      } catch (e) {
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }
  /** Whether anyone listens to `name`. */
  listens(name) {
    return (this.listeners.get(name)?.size ?? 0) > 0;
  }
};

// src/client/seen.ts
var SEEN_WINDOW = 256n;
var SEEN_CAP = 2048;
var SeenSeqs = class {
  floor = 0n;
  recent = /* @__PURE__ */ new Set();
  /** Record `seq`; false if it was handled before (a duplicate). */
  add(seq) {
    if (seq <= this.floor - SEEN_WINDOW || this.recent.has(seq)) return false;
    this.recent.add(seq);
    this.compact();
    return true;
  }
  /** Everything up to `seq` is handled (listed in a SYNC baseline, or pulled). */
  skipTo(seq) {
    if (seq > this.floor) {
      this.floor = seq;
      this.compact();
    }
  }
  compact() {
    let floor = this.floor;
    while (this.recent.has(floor + 1n)) floor += 1n;
    this.floor = floor;
    if (this.recent.size <= SEEN_CAP) return;
    let low = floor - SEEN_WINDOW;
    let kept = [...this.recent].filter((s) => s > low);
    if (kept.length > SEEN_CAP / 2) {
      kept.sort((a, b) => a < b ? -1 : a > b ? 1 : 0);
      this.floor = kept[kept.length - Number(SEEN_WINDOW)];
      low = this.floor - SEEN_WINDOW;
      kept = kept.filter((s) => s > low);
    }
    this.recent = new Set(kept);
  }
};

// src/client/inbox.ts
var CATCH_UP_PAGE = 200;
function newStats() {
  return { connects: 0, reconnects: 0, requests: 0, pushes: 0, caughtUp: 0, dupDrops: 0, sendRetries: 0, heartbeats: 0 };
}
var Inbox = class {
  constructor(api, sink, stats, since = null) {
    this.api = api;
    this.sink = sink;
    this.stats = stats;
    this.since = since;
  }
  api;
  sink;
  stats;
  /** client_msg_ids of sends waiting for their ack. */
  sending = /* @__PURE__ */ new Set();
  seenByConv = /* @__PURE__ */ new Map();
  since;
  running = null;
  again = false;
  first = null;
  stopped = false;
  seen(convId) {
    let seen = this.seenByConv.get(convId);
    if (seen === void 0) this.seenByConv.set(convId, seen = new SeenSeqs());
    return seen;
  }
  /** Give `m` to the app unless it was given before. */
  deliver(m, pulled) {
    if (!this.seen(m.convId).add(m.seq)) {
      this.stats.dupDrops += 1;
    } else if (pulled && m.senderUid === this.api.uid && this.sending.has(m.clientMsgId)) {
    } else {
      if (pulled) this.stats.caughtUp += 1;
      else this.stats.pushes += 1;
      this.sink.message(m, pulled);
    }
  }
  /** Where the next pass's SYNC starts. */
  get nextSince() {
    return this.since ?? 0;
  }
  get catchingUp() {
    return this.running !== null;
  }
  /** Start a catch-up pass, or ask the running one for another pass; resolves when no
   * pass is left, true if the last one completed. `first`: the pass's first SYNC page,
   * already asked (with a new connection's LOGIN). */
  catchUp(first = null) {
    if (first !== null) this.first = first;
    if (this.running !== null) {
      this.again = true;
      return this.running;
    }
    this.stopped = false;
    const run = this.run().finally(() => {
      if (this.running === run) this.running = null;
    });
    this.running = run;
    return run;
  }
  /** No more passes after the running one's current request. */
  stop() {
    this.stopped = true;
    this.again = false;
    this.first = null;
  }
  async run() {
    let ok = false;
    do {
      this.again = false;
      try {
        await this.pass();
        ok = true;
      } catch (e) {
        if (!(e instanceof ClientError)) throw e;
        ok = false;
      }
    } while (this.again && !this.stopped);
    return ok;
  }
  async pass() {
    const baseline = this.since === null;
    const since = this.nextSince;
    let first = this.first;
    this.first = null;
    if (first !== null && !sameOpaque(first.since, since)) first = null;
    let result;
    try {
      result = await this.api.syncAll(since, first);
    } catch (e) {
      if (!(e instanceof ClientError) || e.code !== ErrorCode.BAD_REQUEST || since === 0) throw e;
      result = await this.api.syncAll(0);
    }
    for (const row of result.convs) {
      if (this.stopped) return;
      const seen = this.seen(row.convId);
      if (baseline) seen.skipTo(row.maxSeq);
      else if (row.maxSeq > seen.floor) await this.pullMissed(row.convId, seen);
    }
    if (this.stopped) return;
    this.since = result.nextSince;
    this.sink.synced(result.nextSince, result.convs);
  }
  async pullMissed(convId, seen) {
    let after = seen.floor;
    for (; ; ) {
      let page;
      try {
        page = await this.api.pull(convId, { afterSeq: after, limit: CATCH_UP_PAGE });
      } catch (e) {
        if (e instanceof ClientError && (e.code === ErrorCode.NOT_MEMBER || e.code === ErrorCode.NO_SUCH_CONVERSATION)) {
          return;
        }
        throw e;
      }
      for (const m of page.messages) this.deliver(m, true);
      const last = page.messages[page.messages.length - 1];
      if (last !== void 0) after = last.seq;
      if (!page.hasMore || last === void 0) break;
    }
    seen.skipTo(after);
  }
};

// src/client/session.ts
var MAX_RID = 2147483647;
var PING_GRACE_MS = 1e4;
var RECONNECTING_KICKS = /* @__PURE__ */ new Set([KickReason.DRAINING, KickReason.SHUTDOWN]);
var SEND_AGAIN = /* @__PURE__ */ new Set([0, ErrorCode.UNAVAILABLE, ErrorCode.OUTCOME_UNKNOWN]);
var utf82 = new TextEncoder();
var now = () => performance.now();
var Link = class {
  constructor(endpoint) {
    this.endpoint = endpoint;
    this.loggedIn = new Promise((resolve, reject) => {
      this.settle = { resolve, reject };
    });
    this.loggedIn.catch(() => {
    });
  }
  endpoint;
  transport = null;
  loginOk = null;
  kick = null;
  lastRx = now();
  dead = false;
  loggedIn;
  settle;
};
function newClientMsgId() {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  let out = "";
  for (const b of bytes) out += b.toString(16).padStart(2, "0");
  return out;
}
function expect(frame, kind) {
  if (frame.kind !== kind) throw new ClientError(0, `expected ${kind}, got ${frame.kind}`);
  return frame;
}
var Session = class extends Emitter {
  uid;
  device;
  endpoints;
  stats = newStats();
  /** The last LOGIN_OK (null before the first login). */
  loginOk = null;
  platform;
  requestTimeoutMs;
  inbox;
  token;
  autoReconnect;
  backoffBaseMs;
  backoffCapMs;
  heartbeat;
  catchUpOn;
  sendAttempts;
  sendRetryMs;
  caps;
  link = null;
  // logged in and current
  active = false;
  // between connect() and the end of the session
  closing = false;
  ended = null;
  stateNow = "idle";
  logins = 0;
  // of this session
  nextRid = 0;
  nextEndpoint = 0;
  hint = null;
  pending = /* @__PURE__ */ new Map();
  pongs = [];
  linkWaiters = /* @__PURE__ */ new Set();
  sleepers = /* @__PURE__ */ new Set();
  outbox = /* @__PURE__ */ new Map();
  firstSync = null;
  timer = null;
  lastTx = 0;
  lastPing = 0;
  reconnecting = false;
  giveUpDial = null;
  // abandons the login in progress
  constructor(options, platform2) {
    super();
    this.platform = options.dial ? { ...platform2, dial: options.dial } : platform2;
    const urls = typeof options.url === "string" ? options.url.split(",").filter((u) => u.trim()) : [...options.url];
    if (urls.length === 0) throw new TypeError("no gateway URL given");
    this.endpoints = urls.map((u) => parseEndpoint(u, platform2.base));
    this.uid = toId(options.uid, "uid");
    if (!/^[A-Za-z0-9_-]{1,32}$/.test(options.device)) {
      throw new TypeError(`bad device ${JSON.stringify(options.device)}: must match [A-Za-z0-9_-]{1,32}`);
    }
    this.device = options.device;
    if (options.token !== void 0) {
      this.token = options.token;
    } else if (options.key !== void 0) {
      const key = options.key;
      this.token = ({ uid, device }) => this.platform.mintToken({ key, uid, device });
    } else {
      throw new TypeError("give a token (or, in development, a key to mint one)");
    }
    this.autoReconnect = options.reconnect ?? true;
    this.backoffBaseMs = options.backoffBaseMs ?? 200;
    this.backoffCapMs = options.backoffCapMs ?? 1e4;
    this.requestTimeoutMs = options.requestTimeoutMs ?? 1e4;
    this.heartbeat = options.heartbeat ?? true;
    this.catchUpOn = options.catchUp ?? true;
    this.sendAttempts = options.sendAttempts ?? 8;
    this.sendRetryMs = options.sendRetryMs ?? 3e4;
    this.caps = options.caps ?? CAPS;
    this.inbox = new Inbox(
      this,
      {
        message: (m, caughtUp) => this.emit("message", {
          convId: m.convId,
          seq: m.seq,
          msgId: m.msgId,
          senderUid: m.senderUid,
          msgType: m.msgType,
          content: m.content,
          serverMs: m.serverMs,
          clientMsgId: m.clientMsgId,
          text: m.text,
          caughtUp
        }),
        synced: (nextSince, convs) => this.emit("synced", { nextSince, convs })
      },
      this.stats,
      options.since ?? null
    );
    for (const [conv2, seq] of options.seen ?? []) this.inbox.seen(toId(conv2, "convId")).skipTo(toU64(seq, "seq"));
  }
  // -- lifecycle ----------------------------------------------------------------------
  /** Whether a connection is logged in now. */
  get connected() {
    return this.link !== null;
  }
  get state() {
    return this.stateNow;
  }
  /** Why the session ended; null while it lasts (and before it starts). */
  get endReason() {
    return this.ended;
  }
  /** Where the next catch-up's SYNC starts: keep it to resume a later session. */
  get nextSince() {
    return this.inbox.nextSince;
  }
  /** Sends waiting for their ack, oldest first. */
  get pendingSends() {
    return [...this.outbox.values()].map((p) => ({ ...p }));
  }
  /** Open a connection and LOGIN (each URL tried once), then run the baseline SYNC.
   * Rejects with ClientError for an ERROR answer (auth_failed...), ConnectionLost when
   * no URL could be reached, SessionEnded when closed meanwhile. */
  async connect() {
    if (this.active) throw new Error("client already connected");
    this.ended = null;
    this.closing = false;
    this.active = true;
    this.logins = 0;
    let failure = null;
    for (let i = 0; i < this.endpoints.length; i++) {
      const endpoint = this.pickEndpoint();
      this.setState({ state: "connecting", url: endpoint.url, attempt: 0 });
      let link;
      try {
        link = await this.open(endpoint);
      } catch (e) {
        if (this.closing) throw this.endedError();
        if (e instanceof ClientError && e.code !== 0) {
          this.end(new SessionEnded(`login refused: ${e.message}`));
          throw e;
        }
        failure = e;
        continue;
      }
      if (this.closing) throw this.endedError();
      const first = this.takeFirstSync();
      if (this.catchUpOn && !link.dead) await this.inbox.catchUp(first);
      return link.loginOk;
    }
    const why = failure instanceof Error ? failure.message : String(failure);
    const what = this.endpoints.length === 1 ? "cannot connect" : `cannot connect to any of ${this.endpoints.map((e) => e.url).join(", ")}`;
    this.end(new SessionEnded(what));
    throw new ConnectionLost(`${what}: ${why}`);
  }
  /** Wait until a connection is logged in (after a reconnect, say): its LOGIN_OK.
   * Rejects with SessionEnded if the session ends first, ConnectionLost after
   * `timeoutMs`. */
  async waitConnected(timeoutMs = Infinity) {
    const link = await this.waitLink(now() + timeoutMs);
    return link.loginOk;
  }
  /** LOGOUT (the server drops the route at once and closes), then close. */
  async logout() {
    const link = this.link;
    this.closing = true;
    if (link !== null && !link.dead) {
      const gone = new Promise((resolve) => {
        const done = () => {
          off();
          clearTimeout(timer);
          resolve();
        };
        const off = this.on("state", (s) => {
          if (s.state === "closed") done();
        });
        const timer = setTimeout(done, this.requestTimeoutMs);
      });
      this.write(link, [encodeLogout()]);
      await gone;
    }
    await this.close();
  }
  /** Close the connection and end the session; what waits on it fails with
   * SessionEnded. */
  async close() {
    this.closing = true;
    this.inbox.stop();
    for (const wake of [...this.sleepers]) wake();
    this.giveUpDial?.();
    const link = this.link;
    if (link !== null) this.kill(link, "client closed", true);
    this.end(new SessionEnded("client closed"));
  }
  /** Drop the connection as a network failure would (tests, chaos drills): the client
   * reconnects. */
  dropConnection() {
    this.link?.transport?.abort("dropped by the app");
  }
  // -- what catch-up needs --------------------------------------------------------------
  /** Run a catch-up pass now (SYNC, then PULL what was missed): missed messages arrive
   * as `message` events. Apps call it when they come to the foreground, say. Resolves
   * true when the pass completed. */
  catchUp() {
    return this.inbox.catchUp();
  }
  /** Tell the dedup that the app already has these messages (from `history`): they
   * will not come as events. */
  markSeen(convId, seqs) {
    const seen = this.inbox.seen(toId(convId, "convId"));
    for (const seq of seqs) seen.add(toU64(seq, "seq"));
  }
  /** One SYNC page. */
  async sync(since = 0, cursor = 0, limit = 0) {
    const rid = this.rid();
    return expect(await this.ask(rid, encodeSync(rid, since, cursor, limit), "SYNC"), "sync_result");
  }
  /** Every page of one SYNC pass: the next_since to keep and the rows. `first`: the
   * pass's first page, already asked from the same `since`. */
  async syncAll(since = 0, first = null) {
    const convs = [];
    let cursor = 0;
    for (; ; ) {
      let result;
      if (first !== null) {
        result = await this.answer(first);
        first = null;
      } else {
        result = await this.sync(since, cursor);
      }
      convs.push(...result.convs);
      if (!result.hasMore || sameOpaque(result.nextCursor, cursor)) return { nextSince: result.nextSince, convs };
      cursor = result.nextCursor;
    }
  }
  /** PULL: the first `limit` messages after `afterSeq` (0: from the start). */
  async pull(convId, options = {}) {
    const rid = this.rid();
    const body2 = encodePull(rid, toId(convId, "convId"), toU64(options.afterSeq ?? 0n, "afterSeq"), options.limit ?? 0);
    return expect(await this.ask(rid, body2, "PULL"), "pull_result");
  }
  // -- sending --------------------------------------------------------------------------
  /** SEND; resolves once the message is stored. Offline, it waits for the reconnect;
   * after a lost connection, a timeout, ERROR unavailable or outcome_unknown it sends
   * again with the same client_msg_id, which the server answers with the original ack
   * if the message was stored. A string is sent as UTF-8 text. */
  async send(convId, content, options = {}) {
    const conv2 = toId(convId, "convId");
    const bytes = typeof content === "string" ? utf82.encode(content) : content;
    const msgType = options.msgType ?? MsgType.TEXT;
    const cmid = options.clientMsgId ?? newClientMsgId();
    const entry = { clientMsgId: cmid, convId: conv2, msgType, content: bytes, attempts: 0, queuedAt: Date.now() };
    const deadline = now() + this.sendRetryMs;
    this.outbox.set(cmid, entry);
    this.inbox.sending.add(cmid);
    let attempt = 0;
    try {
      for (; ; ) {
        const link = await this.waitLink(deadline);
        entry.attempts += 1;
        const rid = this.rid();
        try {
          const ack = expect(await this.call(link, rid, encodeSend(rid, conv2, cmid, msgType, bytes), "SEND"), "send_ack");
          return { convId: ack.convId, seq: ack.seq, msgId: ack.msgId, serverMs: ack.serverMs, clientMsgId: cmid };
        } catch (e) {
          if (e instanceof SessionEnded || !(e instanceof ClientError) || !SEND_AGAIN.has(e.code)) throw e;
          attempt += 1;
          if (attempt >= this.sendAttempts || now() >= deadline) throw e;
          this.stats.sendRetries += 1;
          if (e.code !== 0) await this.sleep(this.backoff(attempt));
        }
      }
    } finally {
      if (this.outbox.get(cmid) === entry) this.outbox.delete(cmid);
      this.inbox.sending.delete(cmid);
    }
  }
  // -- request plumbing ---------------------------------------------------------------
  rid() {
    do {
      this.nextRid = this.nextRid % MAX_RID + 1;
    } while (this.pending.has(this.nextRid));
    return this.nextRid;
  }
  /** Send a request on the current connection; its reply. ERROR rejects with
   * ClientError, no reply within requestTimeoutMs with RequestTimeout. */
  ask(rid, body2, name) {
    try {
      return this.call(this.needLink(), rid, body2, name);
    } catch (e) {
      return Promise.reject(e);
    }
  }
  /** A frame without a reply (READ, DELIVERED, TYPING); false when offline. */
  tell(body2) {
    const link = this.link;
    if (link === null || link.dead) return false;
    this.write(link, [body2]);
    return true;
  }
  /** PING and wait for the PONG. */
  async ping() {
    const link = this.needLink();
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new RequestTimeout("no PONG")), this.requestTimeoutMs);
      const settle = (e) => {
        clearTimeout(timer);
        if (e) reject(e);
        else resolve();
      };
      this.pongs.push({ resolve: () => settle(), reject: settle });
      this.write(link, [encodePing()]);
    });
  }
  needLink() {
    if (this.link !== null) return this.link;
    throw this.ended !== null ? this.endedError() : new ConnectionLost("not connected");
  }
  endedError() {
    const e = this.ended;
    return e === null ? new SessionEnded("not connected") : new SessionEnded(e.text, e.kick);
  }
  async waitLink(deadline) {
    for (; ; ) {
      if (this.ended !== null || !this.active) throw this.endedError();
      if (this.link !== null) return this.link;
      const left = deadline - now();
      if (left <= 0) throw new ConnectionLost("not connected; gave up waiting for a reconnect");
      await new Promise((resolve) => {
        const wake = () => {
          this.linkWaiters.delete(wake);
          if (timer !== null) clearTimeout(timer);
          resolve();
        };
        const timer = Number.isFinite(left) ? setTimeout(wake, left) : null;
        this.linkWaiters.add(wake);
      });
    }
  }
  call(link, rid, body2, name) {
    const maxFrame = link.loginOk?.maxFrame ?? Infinity;
    if (body2.length > maxFrame) {
      return Promise.reject(new ClientError(0, `${name} of ${body2.length} bytes exceeds the server's max_frame ${maxFrame}`));
    }
    this.stats.requests += 1;
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve,
        reject,
        timer: setTimeout(() => {
          if (this.pending.get(rid) === waiter) this.pending.delete(rid);
          reject(new RequestTimeout(`no reply to ${name} rid ${rid}`));
        }, this.requestTimeoutMs)
      };
      this.pending.set(rid, waiter);
      try {
        this.write(link, [body2]);
      } catch (e) {
        this.pending.delete(rid);
        clearTimeout(waiter.timer);
        reject(e);
      }
    });
  }
  write(link, bodies) {
    if (link.dead || link.transport === null) throw new ConnectionLost("connection lost");
    link.transport.write(bodies);
    this.lastTx = now();
  }
  takeFirstSync() {
    const first = this.firstSync;
    this.firstSync = null;
    return first;
  }
  // -- connections --------------------------------------------------------------------
  pickEndpoint() {
    if (this.hint !== null) {
      const hint = this.hint;
      this.hint = null;
      return hint;
    }
    const ep = this.endpoints[this.nextEndpoint % this.endpoints.length];
    this.nextEndpoint += 1;
    return ep;
  }
  /** Dial and LOGIN, with the catch-up's first SYNC in the same write; the link is
   * installed the moment LOGIN_OK arrives. Bounded by requestTimeoutMs. */
  async open(endpoint) {
    const link = new Link(endpoint);
    const abort = new AbortController();
    let gaveUp = null;
    const giveUp = (error, why) => {
      if (link.loginOk !== null || link.dead) return;
      link.dead = true;
      gaveUp = error;
      abort.abort(why);
      link.settle.reject(error);
      link.transport?.abort(why);
    };
    const timer = setTimeout(() => {
      const why = `no LOGIN_OK within ${this.requestTimeoutMs} ms`;
      giveUp(new RequestTimeout(`${endpoint.url}: ${why}`), why);
    }, this.requestTimeoutMs);
    this.giveUpDial = () => giveUp(new SessionEnded("client closed"), "client closed");
    let first = null;
    try {
      const source = this.token;
      const token = typeof source === "string" ? source : await source({ uid: this.uid, device: this.device });
      if (link.dead) await link.loggedIn;
      const bodies = [encodeLogin(1, this.uid, this.device, token, this.caps)];
      if (this.catchUpOn) {
        first = this.askAhead(this.inbox.nextSince);
        bodies.push(encodeSync(first.rid, first.since, 0, 0));
      }
      const transport = await this.platform.dial(
        endpoint,
        { frame: (body2) => this.onBody(link, body2), closed: (why) => this.onClosed(link, why) },
        abort.signal
      );
      link.transport = transport;
      if (link.dead) {
        transport.abort("given up");
        await link.loggedIn;
      }
      transport.write(bodies);
      this.lastTx = now();
      await link.loggedIn;
    } catch (e) {
      if (first !== null && link.loginOk === null) this.pending.delete(first.rid);
      if (!link.dead) {
        link.dead = true;
        link.transport?.abort("login failed");
      }
      if (gaveUp !== null) throw gaveUp;
      if (e instanceof ClientError) throw e;
      throw new ConnectionLost(`${endpoint.url}: ${e instanceof Error ? e.message : String(e)}`);
    } finally {
      clearTimeout(timer);
      this.giveUpDial = null;
    }
    this.firstSync = first;
    return link;
  }
  /** Register a SYNC's reply before the request goes out (with a LOGIN). */
  askAhead(since) {
    const rid = this.rid();
    const reply = new Promise((resolve, reject) => {
      this.pending.set(rid, {
        resolve: (f) => {
          try {
            resolve(expect(f, "sync_result"));
          } catch (e) {
            reject(e);
          }
        },
        reject,
        timer: null
        // `answer` bounds the wait for it
      });
    });
    reply.catch(() => {
    });
    this.stats.requests += 1;
    return { since, rid, reply };
  }
  /** The reply to a SYNC asked ahead, within requestTimeoutMs of now. */
  answer(first) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(first.rid);
        reject(new RequestTimeout(`no reply to SYNC rid ${first.rid}`));
      }, this.requestTimeoutMs);
      first.reply.then(
        (r) => (clearTimeout(timer), resolve(r)),
        (e) => (clearTimeout(timer), reject(e))
      );
    });
  }
  /** LOGIN_OK came: `link` is the connection now. */
  install(link) {
    const ok = link.loginOk;
    this.link = link;
    this.loginOk = ok;
    this.stats.connects += 1;
    const reconnected = this.logins > 0;
    this.logins += 1;
    if (reconnected) this.stats.reconnects += 1;
    const t = now();
    link.lastRx = this.lastTx = this.lastPing = t;
    if (this.heartbeat) this.armTimer(Math.max(1, ok.hb) * 1e3);
    this.setState({ state: "online", url: link.endpoint.url, node: ok.node, loginOk: ok, reconnected });
    for (const wake of [...this.linkWaiters]) wake();
  }
  /** Give up on `link`: close it and fail what waits on it; then reconnect or end.
   * Idempotent. */
  kill(link, why, polite = false) {
    if (link.dead) return;
    link.dead = true;
    const current = this.link === link;
    if (current) {
      this.link = null;
      if (this.timer !== null) clearTimeout(this.timer);
      this.timer = null;
      const error = new ConnectionLost(why);
      const pending = [...this.pending.values()];
      this.pending.clear();
      for (const w of pending) {
        if (w.timer !== null) clearTimeout(w.timer);
        w.reject(error);
      }
      const pongs = this.pongs;
      this.pongs = [];
      for (const p of pongs) p?.reject(error);
    }
    if (polite) link.transport?.close();
    else link.transport?.abort(why);
    if (current) this.afterLoss(link, why);
  }
  /** The current connection is gone: end the session or reconnect. */
  afterLoss(link, why) {
    const reason = this.endReasonFor(link);
    if (reason !== null) {
      this.end(new SessionEnded(reason, link.kick));
      return;
    }
    this.setState({ state: "offline", reason: why, kick: link.kick });
    void this.reconnectLoop();
  }
  end(error) {
    if (this.ended === null) {
      this.ended = error;
      this.active = false;
      this.inbox.stop();
      this.setState({ state: "closed", reason: error.text, kick: error.kick });
    }
    for (const wake of [...this.linkWaiters]) wake();
  }
  /** Why the session ends after `link` was lost, or null to reconnect. */
  endReasonFor(link) {
    const kick = link.kick;
    if (this.closing) return "client closed";
    if (kick === null) return this.autoReconnect ? null : "connection lost";
    const what = `kicked: ${kick.reasonName}${kick.text ? ` (${kick.text})` : ""}`;
    if (!this.autoReconnect) return what;
    if (RECONNECTING_KICKS.has(kick.reason)) {
      this.hint = hintEndpoint(link.endpoint, kick.reconnectHint);
      return null;
    }
    if (kick.reason === KickReason.AUTH_REVOKED && typeof this.token !== "string") return null;
    return what;
  }
  /** Exponential backoff, full jitter applied after the cap. */
  backoff(attempt) {
    const ceiling = Math.min(this.backoffCapMs, this.backoffBaseMs * 2 ** Math.min(attempt, 32));
    return Math.random() * ceiling;
  }
  /** A sleep that `close` cuts short. */
  sleep(ms) {
    return new Promise((resolve) => {
      const wake = () => {
        this.sleepers.delete(wake);
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.sleepers.add(wake);
    });
  }
  async reconnectLoop() {
    if (this.reconnecting) return;
    this.reconnecting = true;
    try {
      for (let attempt = 0; ; ) {
        await this.sleep(this.backoff(attempt));
        if (this.closing || this.ended !== null) return;
        attempt += 1;
        const endpoint = this.pickEndpoint();
        this.setState({ state: "connecting", url: endpoint.url, attempt });
        let link;
        try {
          link = await this.open(endpoint);
        } catch (e) {
          if (this.closing || this.ended !== null) return;
          if (e instanceof ClientError && e.code !== 0) {
            const retry = e.code === ErrorCode.UNAVAILABLE || e.code === ErrorCode.AUTH_FAILED && typeof this.token !== "string";
            if (!retry) {
              this.end(new SessionEnded(`reconnect refused: ${e.message}`));
              return;
            }
          }
          this.setState({ state: "offline", reason: e instanceof Error ? e.message : String(e), kick: null });
          continue;
        }
        const first = this.takeFirstSync();
        if (this.closing || this.ended !== null) return;
        if (link.dead) continue;
        const before = this.stats.caughtUp;
        const done = this.catchUpOn ? this.inbox.catchUp(first) : Promise.resolve(true);
        void done.then((ok) => {
          if (ok && this.link === link) this.setState({ state: "back", caughtUp: this.stats.caughtUp - before });
        });
        return;
      }
    } finally {
      this.reconnecting = false;
    }
  }
  setState(event) {
    if (event.state !== "back") this.stateNow = event.state;
    this.emit("state", event);
  }
  // -- inbound frames -----------------------------------------------------------------
  onClosed(link, why) {
    if (link.loginOk === null) {
      link.dead = true;
      link.settle.reject(new ConnectionLost(`${link.endpoint.url} closed the connection at login (${why})`));
      return;
    }
    this.kill(link, `connection lost: ${why}`);
  }
  onBody(link, body2) {
    if (link.dead) return;
    link.lastRx = now();
    let frame;
    try {
      frame = decodeServerFrame(body2);
    } catch (e) {
      const why = `bad frame from the server: ${e.message}`;
      if (link.loginOk !== null) {
        this.kill(link, why);
      } else {
        link.dead = true;
        link.settle.reject(new ClientError(0, why));
        link.transport?.abort(why);
      }
      return;
    }
    if (link.loginOk !== null) {
      this.onFrame(link, frame);
    } else if (frame.kind === "login_ok") {
      link.loginOk = frame;
      this.install(link);
      link.settle.resolve(frame);
    } else {
      const error = frame.kind === "error" ? new ClientError(frame.code, frame.text) : new ClientError(0, `expected LOGIN_OK, got ${frame.kind}`);
      link.dead = true;
      link.settle.reject(error);
      link.transport?.abort("login refused");
    }
  }
  onFrame(link, frame) {
    switch (frame.kind) {
      case "push":
        this.inbox.deliver(frame, false);
        return;
      case "pong":
        this.pongs.shift()?.resolve();
        return;
      case "read_notify":
        this.emit("read", frame);
        return;
      case "typing_notify":
        this.emit("typing", frame);
        return;
      case "notice":
        this.emit("notice", frame);
        return;
      case "sync_hint":
        this.emit("syncHint", frame);
        if (this.catchUpOn && !this.closing) void this.inbox.catchUp();
        return;
      case "kick":
        link.kick = frame;
        this.emit("kick", frame);
        return;
      case "invalid":
      case "login_ok":
        return;
      // an op of a later revision, or a stray LOGIN_OK: ignored
      default: {
        if (frame.kind === "send_ack") this.inbox.seen(frame.convId).add(frame.seq);
        const waiter = this.pending.get(frame.rid);
        if (waiter === void 0) {
          if (frame.kind === "error" && frame.rid === 0) this.emit("error", frame);
          return;
        }
        this.pending.delete(frame.rid);
        if (waiter.timer !== null) clearTimeout(waiter.timer);
        if (frame.kind === "error") waiter.reject(new ClientError(frame.code, frame.text));
        else waiter.resolve(frame);
      }
    }
  }
  /** The heartbeat: PING after `hb` quiet seconds; drop a server that does not answer a
   * PING within 10 s or stays silent for `idle` seconds. */
  onTimer = () => {
    this.timer = null;
    const link = this.link;
    if (link === null || link.loginOk === null) return;
    const t = now();
    const hb = Math.max(1, link.loginOk.hb) * 1e3;
    const idle = Math.max(hb + 1e3, link.loginOk.idle * 1e3);
    const unanswered = this.lastPing > link.lastRx;
    if (t - link.lastRx >= idle || unanswered && t - this.lastPing >= PING_GRACE_MS) {
      this.kill(link, `the server went silent (${Math.round((t - link.lastRx) / 1e3)} s)`);
      return;
    }
    if (t - this.lastTx >= hb || t - link.lastRx >= hb && t - this.lastPing >= hb) {
      this.pongs.push(null);
      this.write(link, [encodePing()]);
      this.lastPing = t;
      this.stats.heartbeats += 1;
    }
    let due = Math.min(this.lastTx + hb, Math.max(link.lastRx, this.lastPing) + hb, link.lastRx + idle);
    if (this.lastPing > link.lastRx) due = Math.min(due, this.lastPing + PING_GRACE_MS);
    this.armTimer(Math.max(due - t, 10));
  };
  armTimer(ms) {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = setTimeout(this.onTimer, ms);
  }
};

// src/client/client.ts
var Client = class extends Session {
  /** OPEN_P2P: the conversation of you and `peer` (always the same one). The peer sees
   * it with its first message. */
  async openP2P(peer) {
    const rid = this.rid();
    return expect(await this.ask(rid, encodeOpenP2P(rid, toId(peer, "peer")), "OPEN_P2P"), "conv_ok").convId;
  }
  /** GROUP_CREATE with the others in it (you are its owner); the conversation. */
  async groupCreate(title, uids) {
    const rid = this.rid();
    return expect(await this.ask(rid, encodeGroupCreate(rid, title, uids), "GROUP_CREATE"), "conv_ok").convId;
  }
  /** GROUP_MEMBERS: add and remove members (the owner; anyone may remove themselves). */
  async groupMembers(convId, change) {
    const rid = this.rid();
    const body2 = encodeGroupMembers(rid, toId(convId, "convId"), change.add ?? [], change.remove ?? []);
    expect(await this.ask(rid, body2, "GROUP_MEMBERS"), "ok");
  }
  async groupInfo(convId) {
    const rid = this.rid();
    const r = expect(await this.ask(rid, encodeGroupInfo(rid, toId(convId, "convId")), "GROUP_INFO"), "group_info_result");
    return { convId: r.convId, title: r.title, ownerUid: r.ownerUid, members: r.members };
  }
  /** HISTORY: the last `limit` messages before `beforeSeq` (0: from the newest), in
   * ascending seq order. Pass them to `markSeen` if they must not come again as
   * events. */
  async history(convId, options = {}) {
    const rid = this.rid();
    const body2 = encodeHistory(rid, toId(convId, "convId"), toU64(options.beforeSeq ?? 0n, "beforeSeq"), options.limit ?? 0);
    const r = expect(await this.ask(rid, body2, "HISTORY"), "history_result");
    return { convId: r.convId, hasMore: r.hasMore, messages: r.messages };
  }
  /** PULL pages from `afterSeq` until has_more is false. */
  async pullAll(convId, options = {}) {
    const out = [];
    let after = toU64(options.afterSeq ?? 0n, "afterSeq");
    for (; ; ) {
      const r = await this.pull(convId, { afterSeq: after, limit: options.limit ?? 0 });
      out.push(...r.messages);
      const last = r.messages[r.messages.length - 1];
      if (!r.hasMore || last === void 0) return out;
      after = last.seq;
    }
  }
  /** RECALL your message (within the server's recall window); the seq of the recall
   * message. */
  async recall(convId, seq) {
    const rid = this.rid();
    const body2 = encodeRecall(rid, toId(convId, "convId"), toU64(seq, "seq"));
    return expect(await this.ask(rid, body2, "RECALL"), "recall_ok").recallSeq;
  }
  /** PRESENCE: the online devices of each uid ([] offline, or not visible to you). */
  async presence(uids) {
    const rid = this.rid();
    const r = expect(await this.ask(rid, encodePresence(rid, uids), "PRESENCE"), "presence_result");
    return new Map(r.entries);
  }
  /** READ up to `seq` (cumulative): tells your other devices and the other members.
   * False when offline: nothing was sent (send the latest position again later). */
  read(convId, seq) {
    return this.tell(encodeRead(toId(convId, "convId"), toU64(seq, "seq")));
  }
  /** DELIVERED up to `seq` (cumulative): this device's position. False when offline. */
  delivered(convId, seq) {
    return this.tell(encodeDelivered(toId(convId, "convId"), toU64(seq, "seq")));
  }
  /** TYPING: the other members see `typing` (repeat it while typing; the server drops
   * more than 2/s). False when offline. */
  typing(convId) {
    return this.tell(encodeTyping(toId(convId, "convId")));
  }
  /** MEDIA_UPLOAD: a signed URL to PUT the file to (url "": stored already). */
  async mediaUpload(sha2562, size, contentType) {
    const rid = this.rid();
    const body2 = encodeMediaUpload(rid, sha2562, size, contentType);
    const r = expect(await this.ask(rid, body2, "MEDIA_UPLOAD"), "media_url");
    return { key: r.key, url: r.url, expiresMs: r.expiresMs };
  }
  /** MEDIA_GET: a signed URL to GET the object of `key` from. */
  async mediaGet(key) {
    const rid = this.rid();
    const r = expect(await this.ask(rid, encodeMediaGet(rid, key), "MEDIA_GET"), "media_url");
    return { key: r.key, url: r.url, expiresMs: r.expiresMs };
  }
  /** PUSH_REGISTER: this device (its uid and device) can be reached through push
   * service `provider` (`apns`, `fcm`, `webpush`...: 1-16 of `[a-z0-9_-]`) at `token`
   * (1-2,048 UTF-8 bytes) while it has no connection. Registering again replaces the
   * registration; a token another device holds moves here. Call it at every start and
   * whenever the push service hands the app a new token. */
  async pushRegister(provider, token, opts = {}) {
    const rid = this.rid();
    const body2 = encodePushRegister(rid, provider, token, opts);
    expect(await this.ask(rid, body2, "PUSH_REGISTER"), "push_register_ok");
  }
  /** PUSH_UNREGISTER: this device's registration goes (also when it had none). `logout`
   * removes it too, but without an answer: call this first to be sure. */
  async pushUnregister() {
    const rid = this.rid();
    expect(await this.ask(rid, encodePushUnregister(rid), "PUSH_UNREGISTER"), "ok");
  }
  /** MUTE: no push notifications of `convId` to your uid's devices until `untilMs` (ms
   * since the epoch; 0, or a time past, unmutes; a time far ahead such as 2n ** 63n - 1n
   * mutes for good). Messages still arrive on connections and count unread. */
  async mute(convId, untilMs) {
    const rid = this.rid();
    const body2 = encodeMute(rid, toId(convId, "convId"), toU64(untilMs, "untilMs"));
    expect(await this.ask(rid, body2, "MUTE"), "ok");
  }
  /** Upload a file: hash it, ask for a URL, PUT it there (fetch) unless the server has
   * it already; its key. */
  async uploadMedia(data, contentType) {
    let digest = "";
    for (const b of await this.platform.sha256(data)) digest += b.toString(16).padStart(2, "0");
    const link = await this.mediaUpload(digest, data.length, contentType);
    if (link.url) {
      const res = await fetch(link.url, {
        method: "PUT",
        headers: { "Content-Type": contentType },
        body: data
      });
      if (!res.ok) throw new ClientError(0, `upload refused: HTTP ${res.status} ${res.statusText}`);
    }
    return link.key;
  }
  /** Upload a file and SEND it as an image (2), voice (3) or file (4) message, by its
   * content type unless `msgType` says; the content is the msgpack map {key, name,
   * size, type}, as `imgw chat` writes it. */
  async sendMedia(convId, data, info) {
    const key = await this.uploadMedia(data, info.contentType);
    const content = encodeMediaContent({ key, name: info.name, size: data.length, type: info.contentType });
    const type = info.contentType;
    const msgType = info.msgType ?? (type.startsWith("image/") ? MsgType.IMAGE : type.startsWith("audio/") ? MsgType.VOICE : MsgType.FILE);
    return { ...await this.send(convId, content, { msgType }), key };
  }
};

// src/token/format.ts
var DEV_KEY = "dev:imgw-dev-secret";
var TOKEN_TTL_S = 86400;
var KID_RE = /^[A-Za-z0-9_-]{1,16}$/;
var DEVICE_RE = /^[A-Za-z0-9_-]{1,32}$/;
function tokenToSign(options) {
  const spec = options.key ?? DEV_KEY;
  const colon = spec.indexOf(":");
  const kid = colon < 0 ? "" : spec.slice(0, colon);
  const secret = colon < 0 ? "" : spec.slice(colon + 1);
  if (!KID_RE.test(kid) || !secret) {
    throw new TypeError("key must be KID:SECRET with KID of 1-16 [A-Za-z0-9_-] and a secret");
  }
  if (!DEVICE_RE.test(options.device)) {
    throw new TypeError(`bad device ${JSON.stringify(options.device)}: must match [A-Za-z0-9_-]{1,32}`);
  }
  const uid = toId(options.uid, "uid");
  const now2 = options.now ?? Math.floor(Date.now() / 1e3);
  const ttl = options.ttlS ?? TOKEN_TTL_S;
  if (!Number.isSafeInteger(now2) || now2 < 0 || !Number.isSafeInteger(ttl) || ttl < 1) {
    throw new RangeError("now and ttlS must be whole seconds, ttlS at least 1");
  }
  const exp = now2 + ttl;
  const signed = options.v1 ? `v1.${kid}.${uid}.${options.device}.${exp}` : `v2.${kid}.${uid}.${options.device}.${now2}.${exp}`;
  return { signed, secret: new TextEncoder().encode(secret) };
}
function base64url(bytes) {
  const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  let out = "";
  let i = 0;
  for (; i + 2 < bytes.length; i += 3) {
    const n = bytes[i] << 16 | bytes[i + 1] << 8 | bytes[i + 2];
    out += abc[n >> 18] + abc[n >> 12 & 63] + abc[n >> 6 & 63] + abc[n & 63];
  }
  if (i + 1 === bytes.length) {
    const n = bytes[i] << 16;
    out += abc[n >> 18] + abc[n >> 12 & 63];
  } else if (i + 2 === bytes.length) {
    const n = bytes[i] << 16 | bytes[i + 1] << 8;
    out += abc[n >> 18] + abc[n >> 12 & 63] + abc[n >> 6 & 63];
  }
  return out;
}

// src/token/sha256.ts
var K = new Uint32Array([
  1116352408,
  1899447441,
  3049323471,
  3921009573,
  961987163,
  1508970993,
  2453635748,
  2870763221,
  3624381080,
  310598401,
  607225278,
  1426881987,
  1925078388,
  2162078206,
  2614888103,
  3248222580,
  3835390401,
  4022224774,
  264347078,
  604807628,
  770255983,
  1249150122,
  1555081692,
  1996064986,
  2554220882,
  2821834349,
  2952996808,
  3210313671,
  3336571891,
  3584528711,
  113926993,
  338241895,
  666307205,
  773529912,
  1294757372,
  1396182291,
  1695183700,
  1986661051,
  2177026350,
  2456956037,
  2730485921,
  2820302411,
  3259730800,
  3345764771,
  3516065817,
  3600352804,
  4094571909,
  275423344,
  430227734,
  506948616,
  659060556,
  883997877,
  958139571,
  1322822218,
  1537002063,
  1747873779,
  1955562222,
  2024104815,
  2227730452,
  2361852424,
  2428436474,
  2756734187,
  3204031479,
  3329325298
]);
function sha256(data) {
  const h = new Uint32Array([
    1779033703,
    3144134277,
    1013904242,
    2773480762,
    1359893119,
    2600822924,
    528734635,
    1541459225
  ]);
  const total = Math.ceil((data.length + 9) / 64) * 64;
  const buf = new Uint8Array(total);
  buf.set(data);
  buf[data.length] = 128;
  const view = new DataView(buf.buffer);
  const bits = data.length * 8;
  view.setUint32(total - 8, Math.floor(bits / 4294967296));
  view.setUint32(total - 4, bits >>> 0);
  const w = new Uint32Array(64);
  for (let off = 0; off < total; off += 64) {
    for (let i = 0; i < 16; i++) w[i] = view.getUint32(off + i * 4);
    for (let i = 16; i < 64; i++) {
      const a2 = w[i - 15];
      const b2 = w[i - 2];
      const s0 = (a2 >>> 7 | a2 << 25) ^ (a2 >>> 18 | a2 << 14) ^ a2 >>> 3;
      const s1 = (b2 >>> 17 | b2 << 15) ^ (b2 >>> 19 | b2 << 13) ^ b2 >>> 10;
      w[i] = w[i - 16] + s0 + w[i - 7] + s1 >>> 0;
    }
    let [a, b, c, d, e, f, g, hh] = h;
    for (let i = 0; i < 64; i++) {
      const S1 = (e >>> 6 | e << 26) ^ (e >>> 11 | e << 21) ^ (e >>> 25 | e << 7);
      const ch = e & f ^ ~e & g;
      const t1 = hh + S1 + ch + K[i] + w[i] >>> 0;
      const S0 = (a >>> 2 | a << 30) ^ (a >>> 13 | a << 19) ^ (a >>> 22 | a << 10);
      const maj = a & b ^ a & c ^ b & c;
      const t2 = S0 + maj >>> 0;
      hh = g;
      g = f;
      f = e;
      e = d + t1 >>> 0;
      d = c;
      c = b;
      b = a;
      a = t1 + t2 >>> 0;
    }
    h[0] = h[0] + a;
    h[1] = h[1] + b;
    h[2] = h[2] + c;
    h[3] = h[3] + d;
    h[4] = h[4] + e;
    h[5] = h[5] + f;
    h[6] = h[6] + g;
    h[7] = h[7] + hh;
  }
  const out = new Uint8Array(32);
  const outView = new DataView(out.buffer);
  for (let i = 0; i < 8; i++) outView.setUint32(i * 4, h[i]);
  return out;
}
function hmacSha256(key, message2) {
  const block = new Uint8Array(64);
  block.set(key.length > 64 ? sha256(key) : key);
  const inner = new Uint8Array(64 + message2.length);
  const outer = new Uint8Array(64 + 32);
  for (let i = 0; i < 64; i++) {
    inner[i] = block[i] ^ 54;
    outer[i] = block[i] ^ 92;
  }
  inner.set(message2, 64);
  outer.set(sha256(inner), 64);
  return sha256(outer);
}

// src/token/web.ts
function subtle() {
  return globalThis.crypto?.subtle;
}
async function mintToken(options) {
  const { signed, secret } = tokenToSign(options);
  const data = new TextEncoder().encode(signed);
  const s = subtle();
  let sig;
  if (s !== void 0) {
    const key = await s.importKey("raw", secret, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
    sig = new Uint8Array(await s.sign("HMAC", key, data));
  } else {
    sig = hmacSha256(secret, data);
  }
  return `${signed}.${base64url(sig)}`;
}
async function sha256Digest(data) {
  const s = subtle();
  if (s === void 0) return sha256(data);
  return new Uint8Array(await s.digest("SHA-256", data));
}

// src/transport/ws.ts
var OPEN = 1;
var CLOSE_CODES = {
  1e3: "closed",
  1001: "gateway going away",
  1003: "the gateway refused a text message",
  1006: "connection lost",
  1009: "message too large"
};
var WsTransport = class {
  constructor(sock, events) {
    this.sock = sock;
    this.events = events;
    sock.onmessage = (ev) => {
      if (this.done) return;
      const data = ev.data;
      if (data instanceof ArrayBuffer) {
        this.events.frame(new Uint8Array(data));
      } else if (ArrayBuffer.isView(data)) {
        this.events.frame(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
      } else {
        this.abort("the gateway sent a text message");
      }
    };
    sock.onerror = () => {
    };
    sock.onclose = (ev) => {
      const what = CLOSE_CODES[ev.code] ?? `close code ${ev.code}`;
      this.finish(ev.reason ? `${what}: ${ev.reason}` : what);
    };
  }
  sock;
  events;
  done = false;
  write(bodies) {
    if (this.done || this.sock.readyState !== OPEN) return;
    for (const b of bodies) this.sock.send(b);
  }
  close() {
    if (this.done) return;
    try {
      this.sock.close(1e3);
    } catch {
      this.abort("closed");
    }
  }
  abort(why) {
    if (this.done) return;
    try {
      if (typeof this.sock.terminate === "function") this.sock.terminate();
      else this.sock.close(1e3);
    } catch {
    }
    this.finish(why);
  }
  finish(why) {
    if (this.done) return;
    this.done = true;
    this.sock.onmessage = this.sock.onclose = null;
    this.events.closed(why);
  }
};
function webSocketDialer(WebSocketImpl) {
  return (endpoint, events, signal) => new Promise((resolve, reject) => {
    if (endpoint.scheme !== "ws" && endpoint.scheme !== "wss") {
      reject(new TypeError(`${endpoint.url}: not a WebSocket URL`));
      return;
    }
    let sock;
    try {
      sock = new WebSocketImpl(endpoint.url);
    } catch (e) {
      reject(e);
      return;
    }
    sock.binaryType = "arraybuffer";
    const drop = () => {
      sock.onopen = sock.onclose = null;
      sock.onerror = () => {
      };
      try {
        if (typeof sock.terminate === "function") sock.terminate();
        else sock.close();
      } catch {
      }
    };
    const onAbort = () => {
      drop();
      reject(new Error(String(signal.reason ?? "aborted")));
    };
    if (signal.aborted) {
      onAbort();
      return;
    }
    signal.addEventListener("abort", onAbort, { once: true });
    sock.onerror = () => {
    };
    sock.onclose = (ev) => {
      signal.removeEventListener("abort", onAbort);
      reject(new Error(`cannot open a WebSocket (close code ${ev.code})`));
    };
    sock.onopen = () => {
      signal.removeEventListener("abort", onAbort);
      sock.onopen = null;
      resolve(new WsTransport(sock, events));
    };
  });
}

// src/browser.ts
function browserDialer(WebSocketImpl) {
  return (endpoint, events, signal) => {
    const impl = WebSocketImpl ?? globalThis.WebSocket;
    if (impl === void 0) return Promise.reject(new Error("no WebSocket in this runtime"));
    if (endpoint.scheme !== "ws" && endpoint.scheme !== "wss") {
      return Promise.reject(new TypeError(`${endpoint.url}: a browser connects by WebSocket: use ws://host:port/ws`));
    }
    return webSocketDialer(impl)(endpoint, events, signal);
  };
}
function platform(options) {
  const location = globalThis.location;
  return {
    dial: options.dial ?? browserDialer(options.WebSocket),
    sha256: sha256Digest,
    mintToken,
    ...location ? { base: location.href } : {}
  };
}
var Client2 = class extends Client {
  constructor(options) {
    super(options, platform(options));
  }
};
async function connect(options) {
  const client = new Client2(options);
  await client.connect();
  return client;
}
export {
  CAPS,
  Client2 as Client,
  ClientError,
  ConnectionLost,
  DEV_KEY,
  ErrorCode,
  KickReason,
  MAX_U64,
  MsgType,
  PROTOCOL_VERSION,
  ProtocolError,
  RequestTimeout,
  SessionEnded,
  TOKEN_TTL_S,
  browserDialer,
  codeName,
  connect,
  decodeMediaContent,
  decodeSystemContent,
  encodeMediaContent,
  kickName,
  mintToken,
  parseEndpoint,
  recalledSeq,
  sha256Digest,
  toId,
  toU64,
  webSocketDialer
};
