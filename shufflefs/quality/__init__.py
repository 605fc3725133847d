"""How well an order is shuffled: the measures (`metrics`: label mix, displacement, entropy,
their expected values), the labels they read from datasets (`labels`) and pictures of orders
(`plots`), for `shufflefs inspect`, `advise` and the docs.  Imports `index` and `formats`.  The
package exposes `metrics`' names, so ``shufflefs.quality.label_mix_tv`` works as before."""

from .metrics import *  # noqa: F401,F403
