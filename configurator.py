"""
nanoGPT's configuration convention, shared by train.py and sample.py:

  python train.py config/gpt2_64m_dyt.py --batch_size=32 --train_tokens=1_000_000

The script's defaults come first; each positional argument is a Python config file executed on top of them
(so `from config.study import *` works from the repo root); then each --key=value override, whose value is
read as a Python literal (a bare word stays a string). Unknown keys and values of the wrong type are errors.
"""
import ast
import difflib
import os

PLAIN = (int, float, bool, str, type(None))


def plain_globals(namespace):
    """The config keys of a script: its public module globals of plain types, less UPPER_CASE constants."""
    return {k: v for k, v in namespace.items() if not k.startswith('_') and not k.isupper() and isinstance(v, PLAIN)}


def configure(defaults, argv, optional_types=None):
    """Return a new dict: defaults <- config files <- --key=value overrides, each value type-checked.

    A value must have its default's type (an int is accepted for a float). Keys that default to None take
    the type given in optional_types (or None)."""
    optional_types = optional_types or {}
    cfg = dict(defaults)

    def set_key(key, value, source):
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else "; see the defaults at the top of the script"
            raise SystemExit(f"error: unknown config key '{key}' (from {source}){hint}")
        want = optional_types.get(key) if defaults[key] is None else type(defaults[key])
        if value is None and defaults[key] is None:
            pass
        elif want is float and type(value) is int:
            value = float(value)
        elif want is not None and type(value) is not want:
            raise SystemExit(f"error: config key '{key}' (from {source}) must be {want.__name__}"
                             f"{' or None' if defaults[key] is None else ''}, got {value!r} ({type(value).__name__})")
        cfg[key] = value

    for arg in argv:
        if not arg.startswith('--'):
            if not os.path.isfile(arg):
                raise SystemExit(f"error: config file '{arg}' not found (arguments are config files and --key=value)")
            namespace = dict(cfg)
            with open(arg) as f:
                exec(compile(f.read(), arg, 'exec'), namespace)
            for key, value in namespace.items():  # modules, functions and _private names are the file's own business
                if not key.startswith('_') and isinstance(value, PLAIN):
                    set_key(key, value, arg)
        else:
            key, eq, text = arg[2:].partition('=')
            if not eq:
                raise SystemExit(f"error: expected --key=value, got '{arg}'")
            try:
                value = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                value = text  # a bare word such as --init_from=resume
            set_key(key, value, arg)
    return cfg
