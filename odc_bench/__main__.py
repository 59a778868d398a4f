from odc_bench.app import main, register_sweeps

if __name__ == "__main__":
    register_sweeps()
    main()
