"""The batch policies at many workers, by simulation (`python -m benchmarks.simulate`): the real
policies of ps/control driven through their BatchPolicy contract by simulated BSP workers.

`population` draws the workers and their time laws, `engine` runs a job in ps/rounds' call order
on a simulated clock, `optimum` is the exact best split the plans are judged against, `metrics`
judges a run (decisions to steady, round over the optimum, CPU), `sweep` runs the grid of
policies and worker counts with the goals of issue 51, and `replay` checks the simulator against real
runs (`python -m benchmarks.simulation_check`). Pure but for the CPU time read around the
policy's calls; imports ps/control and numpy only."""
