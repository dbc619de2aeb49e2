"""Writes the model at argv[1] again with the weights of its first layers in the GGML types quern
converts when it reads a file (quant/qconv.h), and a reference copy holding those same weights as
gguf-py decodes them (F32): quern reading the first must compute what it computes on the second.

  the 576-wide weights of layers 0-5: Q5_0 (even layers) or Q5_1 (odd), gguf-py's quantizers
  ffn_down (1536 wide) of layers 0-5: Q4_K, Q5_K or Q6_K by layer, encoded below (gguf-py
  decodes K types but has no encoder; any valid encoding serves, as the reference is gguf-py's
  decoding of the bytes written)

usage: kquant_model.py MODEL OUT_K OUT_REF"""
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

LAYERS = 6
QK_K = 256


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def nonzero(a):
    """a with its zeros replaced by 1: a divisor for blocks whose scale is 0."""
    return np.where(a != 0, a, 1)


def pack_k_scales(sc, m):
    """ggml's 12-byte layout of 8 six-bit scales and minimums (get_scale_min_k4's inverse)."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def k_scales(x, levels):
    """Per 32-element sub-block: scale, minimum and the 6-bit codes of both over the super-block."""
    sub = x.reshape(-1, 8, 32)
    mn = np.minimum(sub.min(axis=2), 0)
    scale = (sub.max(axis=2) - mn) / levels
    d = f16(scale.max(axis=1) / 63).astype(np.float32)
    dmin = f16((-mn).max(axis=1) / 63).astype(np.float32)
    sc = np.clip(np.rint(scale / nonzero(d)[:, None]), 0, 63)
    m = np.clip(np.rint(-mn / nonzero(dmin)[:, None]), 0, 63)
    step = nonzero(d[:, None] * sc)
    q = np.clip(np.rint((sub + (dmin[:, None] * m)[:, :, None]) / step[:, :, None]), 0, levels)
    return d, dmin, sc, m, q.astype(np.uint8)


def encode_q45_k(x, five):
    d, dmin, sc, m, q = k_scales(x, 31 if five else 15)
    nb = q.shape[0]
    lo = q & 0xF
    qs = np.zeros((nb, 128), dtype=np.uint8)
    for c in range(4):
        qs[:, 32 * c:32 * c + 32] = lo[:, 2 * c] | (lo[:, 2 * c + 1] << 4)
    parts = [f16(d).reshape(nb, 1).view(np.uint8), f16(dmin).reshape(nb, 1).view(np.uint8),
             pack_k_scales(sc, m)]
    if five:
        qh = np.zeros((nb, 32), dtype=np.uint8)
        for s in range(8):
            qh |= ((q[:, s] >> 4) & 1) << s
        parts.append(qh)
    parts.append(qs)
    return np.concatenate(parts, axis=1)


def encode_q6_k(x):
    sub = x.reshape(-1, 16, 16)
    amax_i = np.abs(sub).argmax(axis=2)
    peak = np.take_along_axis(sub, amax_i[:, :, None], axis=2)[:, :, 0]
    scale = peak / -32
    d = f16(np.abs(scale).max(axis=1) / 127).astype(np.float32)
    sc = np.clip(np.rint(scale / nonzero(d)[:, None]), -128, 127)
    step = nonzero(d[:, None] * sc)
    q = (np.clip(np.rint(sub / step[:, :, None]), -32, 31) + 32).astype(np.uint8)
    nb = q.shape[0]
    q = q.reshape(nb, 256)
    ql = np.zeros((nb, 128), dtype=np.uint8)
    qh = np.zeros((nb, 64), dtype=np.uint8)
    for h in range(2):
        e = q[:, 128 * h:128 * h + 128]
        q1, q2, q3, q4 = e[:, 0:32], e[:, 32:64], e[:, 64:96], e[:, 96:128]
        ql[:, 64 * h:64 * h + 32] = (q1 & 0xF) | ((q3 & 0xF) << 4)
        ql[:, 64 * h + 32:64 * h + 64] = (q2 & 0xF) | ((q4 & 0xF) << 4)
        qh[:, 32 * h:32 * h + 32] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8),
                           f16(d).reshape(nb, 1).view(np.uint8)], axis=1)


def encode(x, qtype):
    """x: [rows, cols] floats -> [rows, bytes per row] uint8 of qtype."""
    rows = x.shape[0]
    if qtype in (T.Q5_0, T.Q5_1):
        return quants.quantize(x, qtype)
    flat = x.reshape(-1, QK_K).astype(np.float32)
    if qtype == T.Q6_K:
        b = encode_q6_k(flat)
    else:
        b = encode_q45_k(flat, qtype == T.Q5_K)
    return b.reshape(rows, -1)


def target(name, cols):
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight":
        return None
    layer = int(parts[1])
    if layer >= LAYERS or parts[2].endswith("norm"):
        return None
    if cols % QK_K == 0:
        return (T.Q4_K, T.Q5_K, T.Q6_K)[layer % 3]
    return T.Q5_0 if layer % 2 == 0 else T.Q5_1


def copy_fields(src, w):
    for f in src.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.alignment", "general.architecture"):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)


def main():
    src = gguf.GGUFReader(sys.argv[1])
    arch = src.fields["general.architecture"].contents()
    wk = gguf.GGUFWriter(sys.argv[2], arch)
    wr = gguf.GGUFWriter(sys.argv[3], arch)
    for w in (wk, wr):
        copy_fields(src, w)
    counts = {}
    worst = 0.0
    for t in src.tensors:
        shape = [int(n) for n in reversed(t.shape)]  # numpy order: [rows, cols]
        cols = shape[-1]
        qt = target(t.name, cols) if len(shape) == 2 else None
        if qt is None:
            for w in (wk, wr):
                w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        x = quants.dequantize(t.data, t.tensor_type).reshape(shape)
        b = encode(x, qt)
        y = quants.dequantize(b, qt).reshape(shape).astype(np.float32)
        worst = max(worst, float(np.abs(y - x).max() / np.abs(x).max()))
        wk.add_tensor(t.name, b, raw_shape=b.shape, raw_dtype=qt)
        wr.add_tensor(t.name, y)
        counts[qt.name] = counts.get(qt.name, 0) + 1
    for w in (wk, wr):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    assert set(counts) == {"Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}, counts
    assert worst < 0.2, f"an encoding is off: largest error {worst:.3f} of a tensor's peak"
    print(f"wrote {sum(counts.values())} tensors as {counts}; largest error of the encodings "
          f"{worst:.4f} of a tensor's peak")


if __name__ == "__main__":
    main()
