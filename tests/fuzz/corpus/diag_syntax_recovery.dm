# Each bad statement is reported; the parser resumes at the next line.
input x : f32[4
]]
dim = 3
param w : f32[4] = ones
y = (w + )
