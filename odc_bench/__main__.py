import os
import sys

try:  # Ctrl-C while the harness is still importing ends like Ctrl-C at any other moment
    from odc_bench.cli import interrupted, main
except KeyboardInterrupt:
    print("odc_bench: interrupted; nothing written", file=sys.stderr, flush=True)
    # Nothing has started that needs cleaning up, and an interrupted import (torch's, half done)
    # can make the interpreter's own shutdown end by the signal instead of this status.
    os._exit(130)

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        interrupted(str(e))
