"""The range of dates a result or an environment record may carry (the loader checks both)."""

from __future__ import annotations

import pandas as pd

# The dates a result may carry: those pandas' nanosecond times hold, the years 1677 to 2262.
# pandas 2 and later parse dates beyond in a coarser unit, but `.value`, a frame that mixes
# them with nanosecond times and the pages' arithmetic overflow on them (a record dated 2300
# stopped the load); and no measurement was made in 1600 or 9999.
FIRST_DATE = pd.Timestamp.min.tz_localize("UTC")
LAST_DATE = pd.Timestamp.max.tz_localize("UTC")
