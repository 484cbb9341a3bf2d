"""The stalesgd test suite; a package so that ``tests.helpers`` has one importable full name.

Test files themselves are still collected by pytest one directory at a time;
what they share lives in `tests.helpers`.
"""
