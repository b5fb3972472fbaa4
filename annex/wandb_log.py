"""train.py's wandb_log=True: the run's config, each log.jsonl record and its end also go to Weights &
Biases (wandb_project, wandb_run_name). wandb is not a dependency (pip install wandb). An annex:
run_files.py imports it only with wandb_log=True."""
import importlib.util


def check():  # before any I/O
    if not importlib.util.find_spec('wandb'):
        raise SystemExit('error: wandb_log=True, but wandb is not installed (pip install wandb)')


def start(config):
    import wandb
    wandb.init(project=config['wandb_project'], name=config['wandb_run_name'], config=config)


def log(record):
    import wandb
    wandb.log(record, step=record['iter'])


def finish():  # a stopped run's ends with its process
    import wandb
    wandb.finish()
