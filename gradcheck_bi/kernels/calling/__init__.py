"""Calling a kernel under test, and watching what it does.

Forward and backward by role (:mod:`.opcall`, :mod:`.shaped_call`), in a memory layout
(:mod:`.layout`); what it writes into (:mod:`.writes`); what it is running now
(:mod:`.phase`) and a slow first call (:mod:`.watch`); whether what it raised is a refusal
(:mod:`.refusal`) and which frames of a traceback are its own (:mod:`.trace`).
"""
