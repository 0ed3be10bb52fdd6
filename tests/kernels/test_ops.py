"""Every op direction of tests/ops_registry.py: the C kernel (through pytfm.ops) against
pytfm.reference.

Shapes are drawn to break kernels (1, odd, primes up to 67); values at several scales. Each
output is held to atol + rtol·|ref|, with atol derived, per output, from what float32 can
promise for that op (the registry's Check.tol).
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ops_registry import checked, compare_with_reference


@pytest.mark.parametrize("op", checked(), ids=lambda op: op.name)
@given(data=st.data())
def test_the_c_kernel_matches_the_reference(op, data):
    compare_with_reference(op, data.draw(op.check.draw, label="drawn"))
