"""SQuAD / GLUE processing and official-equivalent metrics. Arrives with the evaluation issue."""
