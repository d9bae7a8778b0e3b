"""The preamble of every child process that checks an export loads without slmlab: it makes
``import slmlab`` impossible (an exported folder must not need it), then imports json and sys."""

import textwrap

NO_SLMLAB = textwrap.dedent('''
    import json, sys

    class NoSlmlab:
        """Make `import slmlab` impossible: the exported folders must not need it."""
        def find_spec(self, name, path=None, target=None):
            if name == "slmlab" or name.startswith("slmlab."):
                raise ImportError(f"{name} is blocked in this process")
            return None

    sys.meta_path.insert(0, NoSlmlab())
''')
