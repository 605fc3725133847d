"""Does SGD converge when it reads label-clustered data through a shufflefs view?

    python tools/bench.py --only convergence [--quick] [--rows N] [--epochs E] [--out DIR]
                                [--strategies S,...] [--models M,...] [--datasets D,...]
                                [--formats F,...] [--blocks N] [--seed N] [--work DIR]

Reproduces the CorgiPile paper's convergence comparison (§7.3.2 Table 3, §7.3.4) through real
mounts.  Two label-clustered training sets, each stored as JSONL and as fixed-size binary records:

- ``digits``: scikit-learn's bundled 8x8 digits (10 classes, 1,437 training rows);
- ``synthetic``: a binary ``make_classification`` problem with ``--rows`` training rows (1 M).

The test set is split off (stratified) before the training set is sorted by label, and is read
straight from memory.  For every strategy the training directory is mounted with ``shufflefs
mount``; each epoch sets the mount's epoch and reads the training file front to back through the
mount, and the records are fed to plain SGD as mini-batches in exactly the order read.  Logistic
regression, a linear SVM (hinge loss) and a one-hidden-layer MLP train side by side on the same
batches.  Writes ``results.csv``, ``results.md`` (final train/test accuracy), ``curves.csv``
(accuracy per epoch), ``accuracy.png`` and ``accuracy-zoom.png`` (test accuracy per epoch) to
``--out``; ``--replot`` draws the PNGs again from ``curves.csv``.

Modules, in the order a run uses them: `settings` (hyperparameters, variants, shared constants),
`data` (the training sets and their files), `mounts` (real mounts and readers of their views),
`models` (the models and one variant's training), `output` (tables and plots), `cli` (the
command line).  Each imports only the modules before it.
"""

from .cli import main
from .data import Data, digits_data, parse_jsonl, store, write_jsonl
from .models import run_variant
from .mounts import interleave, view_reader
from .settings import FORMATS, HYPER, all_variants

__all__ = ["Data", "FORMATS", "HYPER", "all_variants", "digits_data", "interleave", "main", "parse_jsonl",
           "run_variant", "store", "view_reader", "write_jsonl"]
