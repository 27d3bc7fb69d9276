"""Analysis of run directories (pure, no Streamlit): loading a run's files (`load`), derived
series and headline figures (`derive`), the bottleneck verdict per sweep point
(`diagnose`), the P:D recommendation (`recommend`) and studies (`studies`). The dashboard,
the HTML report and the CLI present what these compute."""
