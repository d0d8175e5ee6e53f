"""The study bmrl reproduces ("What Does Multi-Turn Reinforcement Learning Really Improve in LLM
Agents?"): its findings measured once each (`findings`), the written rules that turn their intervals
into verdicts (`verdicts`), and the report's sentences, tables and figures that read those results
(`report`, `figures`). Layer: above the evaluator (`bmrl.eval`), below the commands."""
