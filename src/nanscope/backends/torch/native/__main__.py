"""``python -m nanscope.backends.torch.native``: build the native recorder now."""

import sys

from nanscope.backends.torch.native import cache_dir, failure, load

if load(verbose="-v" in sys.argv) is None:
    print(f"nanscope: the native recorder could not be built: {failure()}", file=sys.stderr)
    sys.exit(1)
print(f"nanscope: native recorder ready in {cache_dir()}")
