"""A person in the seat: ``spasm play`` (the terminal) and the human record it leaves.

:mod:`spasm.play.session` makes a config into one played dialogue and runs it through the
engine; :mod:`spasm.play.terminal` is the terminal a person answers from.
"""
