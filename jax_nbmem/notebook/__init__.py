"""Face: the IPython extension — magics, one kernel's session, its settings, beacon, live panel.

The only part that imports IPython, ipywidgets and plotly (ipywidgets and plotly lazily, when
a panel is shown). It may use every core part; the core never imports it. `session` and
`figure` stay plain Python, so they can be tested without a shell.
"""
