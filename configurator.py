"""
nanoGPT's configuration convention, shared by train.py and sample.py:

  python train.py config/gpt2_64m_dyt.py --batch_size=32 --train_tokens=1_000_000
  python train.py --help                    # the keys and their defaults

The script's defaults come first; each positional argument is a Python config file executed on top of them
(so `from config.study import *` works from the repo root); then each --key=value override, whose value is
read as a Python literal (a bare word stays a string, and so does any value of a string key, e.g.
--out_dir=2024). Unknown keys and values of the wrong type are errors. In a config file, names starting with
'_' (helper variables), imported modules and functions are not keys: they are ignored.
"""
import ast
import difflib
import os

PLAIN = (int, float, bool, str, type(None))


def plain_globals(namespace):
    """The config keys of a script: its public module globals of plain types, less UPPER_CASE constants."""
    return {k: v for k, v in namespace.items() if not k.startswith('_') and not k.isupper() and isinstance(v, PLAIN)}


def run_config_file(path, namespace=None, what='config file'):
    """Execute a Python config file on top of `namespace` (a copy) and return the resulting names."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: {what} '{path}' not found")
    namespace = dict(namespace or {})
    with open(path) as f:
        exec(compile(f.read(), path, 'exec'), namespace)
    return namespace


def configure(defaults, argv, optional_types=None, doc=None):
    """Return a new dict: defaults <- config files <- --key=value overrides, each value type-checked.

    A value must have its default's type (an int is accepted for a float). A key listed in optional_types
    takes that type or None (whatever its default, e.g. top_k = 200 that also accepts None); other keys
    that default to None take any type. --help / -h prints doc's first line and the defaults, and exits 0."""
    optional_types = optional_types or {}
    if '--help' in argv or '-h' in argv:
        print((doc or '').strip().split('\n')[0])
        print('keys and defaults (override with config files and --key=value):')
        print('\n'.join(f'  {k} = {v!r}' for k, v in defaults.items()))
        raise SystemExit(0)
    cfg = dict(defaults)

    def set_key(key, value, source, text=None):
        if key not in defaults:
            close = difflib.get_close_matches(key, list(defaults), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else "; --help lists the keys"
            if not source.startswith('--'):  # a config file's own helper variable
                hint += f" (a helper variable in a config file must start with '_', e.g. _{key}: those are ignored)"
            raise SystemExit(f"error: unknown config key '{key}' (from {source}){hint}")
        nullable = key in optional_types or defaults[key] is None
        want = optional_types.get(key, None if defaults[key] is None else type(defaults[key]))
        if want is str and text is not None and not isinstance(value, (str, type(None))):
            value = text  # --wandb_run_name=2024 means the name '2024', not a number
        if value is None and nullable:
            pass
        elif want is float and type(value) is int:
            value = float(value)
        elif want is not None and type(value) is not want:
            raise SystemExit(f"error: config key '{key}' (from {source}) must be {want.__name__}"
                             f"{' or None' if nullable else ''}, got {value!r} ({type(value).__name__})")
        cfg[key] = value

    for arg in argv:
        if not arg.startswith('--'):
            namespace = run_config_file(arg, cfg)
            for key, value in namespace.items():  # modules, functions and _private names are the file's own business
                if not key.startswith('_') and isinstance(value, PLAIN):
                    set_key(key, value, arg)
        else:
            key, eq, text = arg[2:].partition('=')
            if not eq:
                flag = f"; for a flag write {arg}=True" if isinstance(defaults.get(key), bool) else ''
                raise SystemExit(f"error: expected --key=value, got '{arg}'{flag}")
            try:
                value = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                value = text  # a bare word such as --init_from=resume
            set_key(key, value, arg, text)
    return cfg
