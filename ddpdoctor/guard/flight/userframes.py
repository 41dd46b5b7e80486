"""Which frames of a Flight Recorder stack are the user's: read by the aligner (to quote the user's line) and by a
guarded rank (to send only the frames that matter). Plain regular expressions, so that a rank need not import the
diagnosis to use them."""

from __future__ import annotations

import re

# Frames that are not the user's: torch itself (installed or a source tree), the standard library, <string>.
NOT_USER = re.compile("|".join((
    r"^<",  # <string>, <frozen runpy>
    r"[\\/](site|dist)-packages[\\/](torch|ddpdoctor)[\\/]",
    r"[\\/]torch[\\/](distributed|nn|autograd|utils|_dynamo|multiprocessing)[\\/]",  # a source tree's torch
    r"[\\/]torch[\\/]_tensor\.py$",
    r"[\\/]ddpdoctor[\\/]guard[\\/]",  # the live guard's wrappers around the collectives
    r"[\\/]lib[\\/]python3\.\d+[\\/](?!site-packages|dist-packages)",  # the standard library
)))
DDP_FILE = re.compile(r"[\\/]torch[\\/]nn[\\/]parallel[\\/]distributed\.py$")
AUTOGRAD = re.compile(r"[\\/]torch[\\/]autograd[\\/]")


def is_user(path: str) -> bool:
    return not NOT_USER.search(path)
