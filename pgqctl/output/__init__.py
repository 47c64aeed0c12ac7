"""Everything a command writes on stdout, and its progress bars on stderr.

`formats` writes records in each --format, `fitting` lays a listing out for
the terminal's width, and each other module renders one family of commands
(`jobs`, `stats`, `control`, `schedules`, `workers`, `check`, `metrics`,
`doctor`, `top`, `progress`). A command imports the modules it uses, so this
package imports none of them: the text they share is in `pgqctl.text`.
"""
