"""Run configurations: one ``get_config(arg)`` per file, selected with ``--config=FILE.py:ARG``.

Each file's docstring gives the command, the hardware and time it needs and
the result it should reach; ``arguments.py`` defines the ``[quick,]VARIANT``
argument grammar they share, ``quick.py`` what their ``quick`` variants share
and ``imagenet.py`` the ImageNet files' input pipeline.
"""
