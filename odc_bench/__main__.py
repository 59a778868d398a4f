import sys

try:  # Ctrl-C while the harness is still importing ends like Ctrl-C at any other moment
    from odc_bench.cli import interrupted, main
except KeyboardInterrupt:
    print("odc_bench: interrupted; nothing written", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        interrupted(str(e))
