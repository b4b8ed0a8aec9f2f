// fixture source: only its presence is checked by the spec loader
