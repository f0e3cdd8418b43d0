"""Floor 4, render: pages and figures from finished runs.

    report   `make reports`: the auto blocks of every page     markdown  tables and run lines every page shares
    glossary GLOSSARY.md from the code                          crossview the three systems side by side
    plots    the figures several scripts draw
"""
