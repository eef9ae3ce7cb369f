"""The kernels this tool ships: batch-invariant RMSNorm Functions, correct and defective.

They are kernels under test like a user's (:mod:`gradcheck_bi.kernels.registry` names them
and the defects each declares); nothing of the engine imports them.
"""
