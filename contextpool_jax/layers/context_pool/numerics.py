"""Numerical constants shared by ContextPool's softmaxes (dense, blockwise, streaming)."""

# A finite "minus infinity" for masked logits: exp() of it is exactly 0 in float32
# and, unlike -inf, it never produces inf - inf = NaN in a forward or backward pass.
NEG = -1e30
# Added to 2 sigma^2 so that sigma -> 0 gives a finite (huge) Gaussian exponent.
MIN_TWO_VARIANCE = 1e-12
