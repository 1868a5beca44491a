"""What people read: `traffic status`/`show`, top talkers, the HTML report and bill pages.
"""
