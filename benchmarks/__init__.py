"""Benchmarks: commands that print a table and write JSON; they are not tests. Each module
measures in `measure_<name>` and prints in `print_<name>`. Product code never imports this
package; the CLI loads a benchmark only when it runs."""

__all__: list[str] = []
