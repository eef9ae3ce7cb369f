"""A user's kernel made callable by role: loaded, recognised, adapted.

A reference (``PATH.py:ATTR``, ``package.module:ATTR``, a named adapter) is loaded
(:mod:`.loader`, :mod:`.named`); what the kernel computes is read from its parameters and one
forward (:mod:`.recognise`, :mod:`.behaviour`, :mod:`.shaped_adapt`), its load-time calls
isolated in a child process (:mod:`.sandbox`); its parameters are bound to the op's roles
(:mod:`.signature`, :mod:`.build`, :mod:`.adapters`, :mod:`.opadapt`, :mod:`.asop`).
"""
