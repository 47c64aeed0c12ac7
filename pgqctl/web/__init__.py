"""`pgqctl web`: the queue in a browser, read from the database through the
same library calls as the commands (an optional extra: `pgqctl[web]`).

`app.py` builds the application: its routes call `pages.py`, which reads
the queue through pgqctl's library and hands plain values to the templates
(`templates/`, escaped by Jinja2); `live.py` refreshes what open pages show
once a second, however many are open; `pool.py` lends connections;
`access.py` decides who may look. Nothing here prints.
"""
