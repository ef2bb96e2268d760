"""The release-approval app (Streamlit): a candidate's lineage and evidence, challenger vs champion, approve,
promote and roll back, with login and the ledger. It only calls `registry` and shows what it says."""
