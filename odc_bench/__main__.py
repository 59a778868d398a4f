import gc
import signal
import sys

# Ctrl-C while the harness is still importing ends like Ctrl-C at any other moment. SIGINT is held
# until the imports are done: torch's C extension imports numpy and swallows whatever that import
# raises, a KeyboardInterrupt included, which left numpy half imported and the run going on (it
# failed later with "module 'numpy' has no attribute 'matrix'"). A held Ctrl-C is raised on release.
# torch and Triton are imported later, by the runs that need them, with Ctrl-C held the same way.
try:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        from odc_bench.cli import interrupted, main
        from odc_bench.errors import ends_cleanly
        from odc_bench.files import hold_interrupts_while_importing

        hold_interrupts_while_importing("torch", "triton")
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
except KeyboardInterrupt:
    print("odc_bench: interrupted; nothing written", file=sys.stderr, flush=True)
    sys.exit(130)  # nothing has started that needs cleaning up


def run() -> None:
    """`python -m odc_bench` and the `odc-bench` script."""
    try:
        with ends_cleanly():
            main()
    except KeyboardInterrupt as e:
        interrupted(str(e))
    finally:
        # At exit the interpreter's collections would scan every object the run left only to
        # free memory the process hands back whole; frozen, they are skipped. The atexit
        # handlers (the heaps' close, the display's) still run, and no cleanup here waits on a
        # collection: shared memory, temporary folders and files are closed by their owners.
        gc.freeze()


if __name__ == "__main__":
    run()
