"""kvsim's figures and general reports, each a module that also runs as a command
(`python3 -m kvsim.report.NAME --help`):

- figures: every figure there is data for in result files (what `kvsim figures` runs);
- figure_style: the colour, marker and legend every figure shares;
- sweep_report: the table and figures of a `kvsim sweep` results file;
- replay_vs_live: replay's metrics joined with live evaluations of the same policies;
- prediction_card: how well replay predicts a live outcome, out of sample;
- csv_table: a table written as CSV with its floats in one printf format, fast;
- tolerance: a result table compared with the one committed for it, within the tolerances that
  separate another machine's arithmetic from a change of the code.

The reports of one experiment live with it (experiments/reports/)."""
