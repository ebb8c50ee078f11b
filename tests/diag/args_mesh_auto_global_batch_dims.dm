# args: --mesh auto --devices 2 --global-batch 16 --set E0=1,E1=1,E2=1,E3=1,E4=1,E5=1,E6=1,E7=1,E8=1,E9=1,E10=1,E11=1,E12=1,E13=1,E14=1,E15=1,E16=1,E17=1,E18=1,E19=1,E20=1,E21=1,E22=1,E23=1,E24=1,E25=1,E26=1,E27=1,E28=1,E29=1,E30=1,E31=1,E32=1,E33=1,E34=1,E35=1,E36=1,E37=1,E38=1,E39=1,E40=1,E41=1,E42=1,E43=1,E44=1,E45=1,E46=1,E47=1,E48=1,E49=1,E50=1,E51=1,E52=1,E53=1,E54=1,E55=1,E56=1,E57=1,E58=1,E59=1,E60=1,E61=1,E62=1,E63=1
# exit: 2
# --mesh auto --global-batch adds the batch as one more --set: with 64 --set dims
# already it has no room (it wrote past the 64 and crashed), so it is refused.
mesh(data = 1)
dim B = 8
dim D = 4
dim E0 = 1
dim E1 = 1
dim E2 = 1
dim E3 = 1
dim E4 = 1
dim E5 = 1
dim E6 = 1
dim E7 = 1
dim E8 = 1
dim E9 = 1
dim E10 = 1
dim E11 = 1
dim E12 = 1
dim E13 = 1
dim E14 = 1
dim E15 = 1
dim E16 = 1
dim E17 = 1
dim E18 = 1
dim E19 = 1
dim E20 = 1
dim E21 = 1
dim E22 = 1
dim E23 = 1
dim E24 = 1
dim E25 = 1
dim E26 = 1
dim E27 = 1
dim E28 = 1
dim E29 = 1
dim E30 = 1
dim E31 = 1
dim E32 = 1
dim E33 = 1
dim E34 = 1
dim E35 = 1
dim E36 = 1
dim E37 = 1
dim E38 = 1
dim E39 = 1
dim E40 = 1
dim E41 = 1
dim E42 = 1
dim E43 = 1
dim E44 = 1
dim E45 = 1
dim E46 = 1
dim E47 = 1
dim E48 = 1
dim E49 = 1
dim E50 = 1
dim E51 = 1
dim E52 = 1
dim E53 = 1
dim E54 = 1
dim E55 = 1
dim E56 = 1
dim E57 = 1
dim E58 = 1
dim E59 = 1
dim E60 = 1
dim E61 = 1
dim E62 = 1
dim E63 = 1
input x : f32[B@data, D]
input y : i32[B@data]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
