"""nanoGPT's config convention: a script's defaults, then each config file (Python, run on top),
then each --key=value as a Python literal (a bare word, or a str key's value, stays a str)."""
import ast
import difflib
import importlib
import inspect
import os
import runpy
import sys
import types

PLAIN = (int, float, bool, str, type(None))


def config_keys(namespace):  # (defaults, optional types): a script's plain lower-case globals
    defaults = {k: v for k, v in namespace.items()
                if not k.startswith('_') and not k.isupper() and isinstance(v, PLAIN)}
    hints = inspect.get_annotations(sys.modules[namespace['__name__']])
    return defaults, {k: next(t for t in h.__args__ if t is not type(None))
                      for k, h in hints.items() if isinstance(h, types.UnionType) and k in defaults}


def run_config_file(path, namespace=None, what='config file'):
    """The names a config file leaves, run on top of a copy of `namespace`."""
    if not os.path.isfile(path):
        folder = os.path.dirname(path)
        files = os.listdir(folder or '.') if os.path.isdir(folder or '.') else []
        close = difflib.get_close_matches(path, [os.path.join(folder, f) for f in files])
        hint = f"; did you mean {' or '.join(close)}?" if close else ''
        raise SystemExit(f"error: {what} '{path}' not found{hint}")
    return runpy.run_path(path, init_globals=namespace)  # a new dict: namespace stays as it was


def split_args(argv):  # (positional arguments, --key=value options)
    return [a for a in argv if not a.startswith('-')], [a for a in argv if a.startswith('-')]


def checked(key, value, defaults, optional_types, source, text=None):
    """value if key takes it (the default's type; an int does for a float), else an error."""
    if key not in defaults:
        close = difflib.get_close_matches(key, defaults)
        hint = f"; did you mean {' or '.join(close)}?" if close else "; --help lists the keys"
        if not source.startswith('--'):
            hint += f" (a config file's helpers must start with '_', e.g. _{key}, to be ignored)"
        raise SystemExit(f"error: unknown config key '{key}' (from {source}){hint}")
    nullable = key in optional_types or defaults[key] is None
    want = optional_types.get(key, None if defaults[key] is None else type(defaults[key]))
    if want is str and text is not None and not isinstance(value, (str, type(None))):
        return text  # --wandb_run_name=2024 means the name '2024', not a number
    if want is None or type(value) is want or (value is None and nullable):
        return value
    if want is float and type(value) is int:
        return float(value)
    raise SystemExit(f"error: config key '{key}' (from {source}) must be {want.__name__}"
                     f"{' or None' if nullable else ''}, got {value!r} ({type(value).__name__})")


def configure(defaults, argv, optional_types=None, doc=None):
    """A new dict of the checked values; --help prints doc and the defaults."""
    optional_types = optional_types or {}
    if '--help' in argv or '-h' in argv:
        print((doc or '').strip())
        print('\nkeys and defaults (override with config files and --key=value):')
        print('\n'.join(f'  {k} = {v!r}' for k, v in defaults.items()))
        raise SystemExit(0)
    cfg = dict(defaults)
    for arg in argv:
        if not arg.startswith('--'):
            for key, value in run_config_file(arg, cfg).items():
                if not key.startswith('_') and isinstance(value, PLAIN):  # not modules, functions
                    cfg[key] = checked(key, value, defaults, optional_types, arg)
            continue
        key, eq, text = arg[2:].partition('=')
        if not eq:
            flag = f"; for a flag write {arg}=True" if isinstance(defaults.get(key), bool) else ''
            raise SystemExit(f"error: expected --key=value, got '{arg}'{flag}")
        try:
            value = ast.literal_eval(text)
        except (SyntaxError, ValueError):
            value = text  # a bare word such as --init_from=resume
        cfg[key] = checked(key, value, defaults, optional_types, arg, text)
    return cfg


def annex(name, needed_by=None):  # annex/<name>.py; None if deleted, or needed_by's error
    try:
        return importlib.import_module(f'annex.{name}')
    except ModuleNotFoundError as e:
        if e.name not in ('annex', f'annex.{name}'):
            raise
        if needed_by:
            raise SystemExit(f'error: {needed_by} needs annex/{name}.py, which this copy lacks '
                             '(restore it from the nanonorm repository)') from None
        return None
