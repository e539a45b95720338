"""Makes the NumPy fixtures of runtime/tests/numpy_fixtures.rs with NumPy itself.

Run from this folder with a Python that has NumPy (the venv `shardc bench` sets up has it):
`python make.py`. The versions it ran with are in VERSIONS.
Every array is a formula of its indices, so the test checks each element.
"""
import sys

import numpy as np

x = (np.arange(4 * 6, dtype=np.float32).reshape(4, 6) / 8.0) - 1.0
label = np.array([3, 0, 2, 1], dtype=np.int32)
mask = np.array([True, False, True, True])
wide = np.arange(4, dtype=np.int64) * (1 << 40)
half = np.linspace(-2.0, 2.0, 8, dtype=np.float16).reshape(4, 2)
image = (np.arange(4 * 3 * 2, dtype=np.uint8) * 9).reshape(4, 3, 2)

np.savez("arrays.npz", x=x, label=label, mask=mask, wide=wide, half=half)
np.savez_compressed("compressed.npz", x=x, label=label)
np.save("image_uint8.npy", image)
np.save("x_fortran.npy", np.asfortranarray(x.astype(np.float64)))
np.save("x_big_endian.npy", x.astype(">f4"))

with open("VERSIONS", "w") as f:
    f.write(f"python {sys.version.split()[0]}\nnumpy {np.__version__}\n")
