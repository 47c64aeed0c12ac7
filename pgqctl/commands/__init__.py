"""The commands, one module per family: each parses its options, calls one
library function (`pgqctl/<family>.py`), and hands the result to `output`.

`pgqctl.cli` puts them together in one group, which imports a command's
module only when that command is used (`lazy`).
"""
