"""Sample from a trained model (any variant), decoding with the tokenizer the run was trained with.
  python sample.py --out_dir=out/gpt2_64m_dyt --ckpt=best --start=FILE:prompt.txt --temperature=0.7
  python sample.py --out_dir=out --start="def " --num_samples=3 --max_new_tokens=200"""
import sys

import torch

from checkpoint import CHECKPOINTS, checkpoint_file, load_checkpoint
from configurator import config_keys, configure
from data.common import DataError, get_tokenizer
from distributed import pick_device, precision

out_dir = 'out'
ckpt = 'latest'  # 'latest' (out_dir/ckpt.pt), 'best' (best.pt), or a file
start = '\n'  # the prompt, or "FILE:path" to read it from a file
num_samples = 3
max_new_tokens = 200
temperature = 0.8  # 1.0: the model's distribution, lower: safer, 0: greedy
top_k: int | None = 200  # only the top_k most likely tokens; None: all
seed = 1337
device: str | None = None  # None = cuda if available, else mps, else cpu
dtype: str | None = None  # float32, bfloat16 or float16; None: bfloat16 if CUDA has it
compile = False  # torch.compile (dynamic shapes: the sequence grows)
tiktoken_file: str | None = None  # GPT-2 .tiktoken ranks file for offline machines
DEFAULTS, OPTIONAL_TYPES = config_keys(globals())


def main(argv):
    cfg = configure(DEFAULTS, argv, OPTIONAL_TYPES, __doc__)
    if cfg['dtype'] not in (None, 'float32', 'bfloat16', 'float16'):
        raise SystemExit(f"error: dtype={cfg['dtype']!r} is not known (float32, bfloat16, float16)")
    start = cfg['start']
    if start.startswith('FILE:'):
        try:
            with open(start[5:], encoding='utf-8') as f:
                start = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f'error: cannot read the prompt file {start[5:]!r} (--start): {e}')
    torch.manual_seed(cfg['seed'])
    try:
        device, ckpt = pick_device(cfg['device']), cfg['ckpt']
        path = checkpoint_file(cfg['out_dir'], ckpt) if ckpt in CHECKPOINTS else ckpt
        model, checkpoint = load_checkpoint(path, device, language_model=True)
        tiktoken_file = cfg['tiktoken_file'] or checkpoint.get('config', {}).get('tiktoken_file')
        tok = get_tokenizer(checkpoint.get('tokenizer', 'gpt2'), tiktoken_file)
    except (FileNotFoundError, ValueError, DataError) as e:
        raise SystemExit(f'error: {e}') from None
    if cfg['compile']:  # in place: torch.compile(model).generate() runs eager
        model.compile(dynamic=True)
    ids = tok.encode(start) or [tok.eot]  # an empty prompt: end-of-text
    if max(ids) >= model.config.vocab_size:
        raise SystemExit(f"error: prompt token id {max(ids)} is outside the model's vocabulary "
                         f"({model.config.vocab_size}); was the data tokenized with {tok.name}?")
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, -model.config.block_size:]
    with precision(device, cfg['dtype'])[1]:  # autocast unless float32
        for _ in range(cfg['num_samples']):  # decoded without the padding ids
            y = model.generate(x, cfg['max_new_tokens'], cfg['temperature'], cfg['top_k'])[0]
            print(tok.decode([i for i in y.tolist() if i < tok.n_vocab]) + '\n---------------')


if __name__ == '__main__':
    main(sys.argv[1:])
