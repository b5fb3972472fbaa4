# placeholder: settings chosen by experiment below
scales = {'mini': dict(n_layer=4, n_head=4, n_embd=128)}
budgets = [50_000, 300_000, None]
variants = ['ln', 'dyt']
seeds = [1337, 42]
