"""What each measured error is held to: every tolerance formula and constant, in one place.

* forward: the output's rounding plus the compute dtype's rounding in any summation order,
  ``max|ref| · (u_out + u_c · forward_factor(n))`` over the statistic's ``n`` terms, with
  ``|ref − β| + |β|`` for ``|ref|`` where a β is added (:mod:`.rows`, :mod:`.summation`);
* dx, dw (and every ``d<input>``, ``d<parameter>``): per element, ``K_SIGMA`` × (the measured
  rounding noise of that element's finite difference (:mod:`.noise`, from the forward alone)
  and the kernel's own rounding in any summation order (:mod:`.summation`, :mod:`.rows`,
  from the inputs alone), in quadrature) + ``K_TRUNC`` × Richardson's truncation estimate;
  pass iff ``max_i err_i / tol_i ≤ 1``;
* bf16/fp16: the ulp audit's pass rule and the lifted gradients' tolerance (:mod:`.half`);
* batch invariance: 0, every compared element bitwise identical;
* the tables' one-line account of each (:mod:`.notes`), built from these constants.

``--atol`` replaces the derived tolerance (of every element); ``--rtol`` adds
``rtol × max|reference|`` (:mod:`.rules`).

The measurements themselves live elsewhere: the finite differences in
:mod:`gradcheck_bi.fd`, the checks in :mod:`gradcheck_bi.checks`. This package imports only
the fixed-order row sum (:mod:`gradcheck_bi.sums.reduction`), the op records and the
vocabulary.
"""
