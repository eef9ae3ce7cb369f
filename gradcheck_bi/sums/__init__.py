"""Fixed-order sums: a row's bits never depend on how many rows are summed with it.

A leaf: it imports nothing of the package. The bundled kernels
(:mod:`gradcheck_bi.kernels.bundled.rmsnorm`), the finite differences (:mod:`gradcheck_bi.fd`) and
the tolerances (:mod:`gradcheck_bi.tolerance`) all sum here, so the engine and the kernels it
ships share one reduction order without the engine importing a kernel under test.
"""
