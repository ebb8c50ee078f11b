input x : [4, 3]
