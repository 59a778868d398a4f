"""Put on PYTHONPATH with ODC_TEST_RECORD naming a file, a process sends itself Ctrl-C (SIGINT)
from inside torch's C++ autograd initialisation (the first Python function that C++ calls), as a
Ctrl-C pressed at that moment arrives. It writes `sent` to that file, then whether the C++ call
returned or raised (`sent` stays where the interrupt was raised in the sender itself). Raised
through C++ that may not throw, such a KeyboardInterrupt aborted the command (pybind11's
error_already_set, SIGABRT) in a few of every hundred Ctrl-Cs during the import."""

import os
import signal
import sys
from pathlib import Path

_RECORD = Path(os.environ["ODC_TEST_RECORD"])
_state: dict[str, bool] = {}


def _profile(frame, event, arg):
    init = getattr(arg, "__name__", "") == "_autograd_init"
    if event == "c_call" and init:
        _state["inside"] = True
    elif event == "call" and _state.get("inside") and not _state.get("sent"):
        _state["sent"] = True
        _RECORD.write_text("sent", encoding="utf-8")
        os.kill(os.getpid(), signal.SIGINT)
    elif event in ("c_return", "c_exception") and init:
        sys.setprofile(None)
        _RECORD.write_text("returned" if event == "c_return" else "raised", encoding="utf-8")


sys.setprofile(_profile)
