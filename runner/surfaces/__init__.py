"""What people, harnesses and observers meet: the verbs and their one table (verbs), the command line (cli), the MCP
server (mcp/), the harness hooks (hooks), and read-only views: brief, status and report (views), the history read
back from the journal (history), the timeline page (timeline) and the OTLP trace (otlp).

May import: runner.base, runner.contract, runner.ledger, runner.stores, runner.calls, runner.adapters, runner.execution.
"""
