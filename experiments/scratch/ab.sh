# Sourced by the scratch device-call scripts: ab NAME STATEMENT ARGS runs experiments/norm_sweep.py as NAME (results
# experiments/results/NAME.json, torch left out) after STATEMENT on cuflash.norm (module n), with norm_sweep ARGS.
ab() {
  timeout 90 python -c "import runpy, sys; sys.path.insert(0, '.'); import cuflash.norm as n; $2
sys.argv = ['norm_sweep.py', '--no-torch', '--name', '$1'] + '$3'.split()
runpy.run_path('experiments/norm_sweep.py', run_name='__main__')" 2>&1 | grep -v "it/s" | tail -1
}
