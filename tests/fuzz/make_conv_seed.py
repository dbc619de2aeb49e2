"""Writes tests/fuzz/corpus/gguf/tiny-conv.gguf: the tiny BPE seed model with its weights in the
types quern converts when it reads a file (quant/qconv.h), Q5_0 and Q5_1 in turn, and three
more tensors of 256 elements in Q4_K, Q5_K and Q6_K (read and converted, not used by the model),
so fuzz_gguf starts from inputs that reach every conversion. Deterministic; run it with the gguf
package (tests/test_quantize_cli.sh's venv) when the seed should change:

  build/venv-gguf/bin/python tests/fuzz/make_conv_seed.py"""
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(here))
from kquant_model import copy_fields  # noqa: E402  (tests/, beside this folder)

src = gguf.GGUFReader(os.path.join(here, "corpus/gguf/tiny-bpe.gguf"))
out = gguf.GGUFWriter(os.path.join(here, "corpus/gguf/tiny-conv.gguf"),
                      src.fields["general.architecture"].contents())
copy_fields(src, out)
for i, t in enumerate(src.tensors):
    shape = [int(n) for n in reversed(t.shape)]
    if len(shape) == 2 and t.name.startswith("blk."):
        qt = T.Q5_0 if i % 2 == 0 else T.Q5_1
        x = quants.dequantize(t.data, t.tensor_type).reshape(shape)
        b = quants.quantize(x, qt)
        out.add_tensor(t.name, b, raw_shape=b.shape, raw_dtype=qt)
    else:
        out.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
rng = np.random.default_rng(7)
for qt, nbytes in ((T.Q4_K, 144), (T.Q5_K, 176), (T.Q6_K, 210)):
    b = rng.integers(0, 256, size=(1, nbytes), dtype=np.uint8)
    scale = np.array([0.01], dtype=np.float16).view(np.uint8)
    if qt == T.Q6_K:
        b[0, 208:210] = scale
    else:
        b[0, 0:2] = scale
        b[0, 2:4] = scale
    out.add_tensor("conv." + qt.name.lower(), b, raw_shape=b.shape, raw_dtype=qt)
out.write_header_to_file()
out.write_kv_data_to_file()
out.write_tensors_to_file()
out.close()
