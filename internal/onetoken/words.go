// Package onetoken holds words that are one token each, with a leading space, in both
// the embedded Qwen3 tokenizer and the approximate one (and two after a newline: the
// newline and the word). The simulated workers generate answers from them and the
// demo and load test write prompts with them, so a prompt's length in tokens is known
// whichever of the two tokenizes it.
package onetoken

import "strings"

// Words returns the words, sorted; the slice is the caller's.
func Words() []string { return strings.Fields(words) }

// words are the 3-letter lowercase words with that property (generated from the
// tokenizers and checked by this package's test).
const words = `
aaa aan aba abb abc abi abl abs aby acc ace ach ack acl act ada adb adc add ade adj adm ado adr
ads adv aes aff afs age agg ago agr aid ail aim ain air ais aka ako akt aku alc ald ale alf alg
ali alk all alm alo als alt ama amb amd ami amo amp amt amy ana anc and ang ani ank ann ano ans
ant any anz aos apa ape aph api apk apl apo app apr apt aqu ara arb arc ard are arg ark arm arp
arr art ary asc ash asi ask asm asn ass ast ata ate ath atl atr att auc aud auf aug aur aus aut
aux ava ave avg avi awe awk aws axe azi bab bac bad bag bah bak bal bam ban bar bas bat bay baz
bbc bcm beb bed bee bef beg beh bei bek bel ben ber bes bet bew bez bfd bib bic bid big bij bil
bin bio bir bis bit biz bla ble blk blo bmp boa bob bol bon boo bor bos bot bow box boy bpp bra
bre bro bru bst btc btn bud buf bug bul bum bur bus but buy bye cab cac cad caf cal cam can cap
car cas cat cbd cdr cel cen cep cer ces cfg cgi cha che chi chk cho chr chu cid cil cin cio cir
cis cit cla cle clf cli clk clo clr cls cmb cmd cmp cms cnt cob coc cod coh col com con cop cor
cos cot cou cov cow cpf cpp cps cpt cpu crc cre cri cro cry csr css csv ctl ctr ctx cue cul cum
cup cur cus cut cwd czy dac dad dag dal dam dan dao dap dar das dat day dbc dbg dbl dbo dcc ddl
deb dec ded dee def deg del dem den dep der des det dev dex dez dfs dia dic did die dif dig dim
din dio dir dis dit div dlg dll dma dna dni dns dob doc dog doi dom don dos dot dpi dra dre drm
dro drv dry dsp dst dto due duk dup dur dyn dzi ear eat eax ebp ebx ecc ech eco ecs ect ecx edi
edm eds edu edx een eer eff egg ego egt eid ein eks ela ele elf ell elm elo els elt emb emo emp
enc end eng enh enn ens ent env eof eos eps equ era erb ere erg erk erm ern ero err ers erv ery
esa esc ese esi esk eso esp ess est eta etc eth ett eve evt exc exe exp ext eye fab fac fal fan
far fas fat fav fax fds fec fed fee fel fen fer few ffi fft fib fic fid fig fil fin fir fit fix
fld flo flu fly fmt fol fon foo for fos fov fox fps fra fre frm fst ftp ful fun fur gal gam gan
gap gar gas gay gcc gcd geb ged gee gef geh gel gem gen geo ger ges get gew gfx gia gid gif gin
gio git gle gli glm gly god gon goo gor got gov gps gpu gra gre gro grp gst gtk gui gun hab had
hai hal ham han hap har has hat hay hdr hed hei hel hem hen her hes het hex hey hic hid hil him
hin hip his hit hoc hoe hog hol hom hon hop hor hos hot how hrs htt hub hud hue hum hus hyp iam
iar ice ich ici icy ide idi ids idx iff ifs ign ihn iid iii ila ile ili ilk ill ils ima imb ime
img imm imp ims imu inc ind ine inf ing inh ini ink inn inp ins int inv iod ion ios iov ipc ips
ipt ipv irc ire irm irq isa isc ise isi isl iso isp iss ist ith itm itr its itu ive jab jac jak
jal jam jan jar jav jaw jej jer jes jet jit jmp job jon jos joy jpg jsx jud jug jun jur jwt kad
kal kan kap kar kas kat ked kel ken ker kes ket key kid kil kim kin kir kit kle kok kol kom kon
kop kor kos kre ksi ksz kul kur lab lac lad lag lah lam lan lap lar las lat lav law lay lbl lbs
lcd lda ldb led lee leg lei lem len leo ler les let lev lex ley lhs lia lib lic lid lie lig lij
lik lim lin lip lis lit liv lle lng lob loc lod log loi lok lol lon lor los lot lov low lst lua
lug lut lux lvl lyn lys mac mad mag mah mai maj mak mal man map mar mas mat max may mdb mdi mdl
med meg mel mem men mer mes met mez mgr mia mic mid mie mil min mir mis mit mix mlx mmc mob mod
mol mom mon mor mos mot mov moz mph mpi mpl mpz mse msg mtx mue mul mun mur mus mut mux mys nad
nah nak nal nam nan nap nar nas nat nav naz nbr ned neg neh nel nen neo ner net new nex nga ngo
ngx nic nid nie nik nil nim nin nip nit nob noc nod nom non nop nor nos not nov now npc npm nth
num nut nya obe obj obl obs occ och oci oct odd ode off ofs oft ogl ogr ogs oid oil oko old ole
oli olu oma omp one ons ont ook opc opi opp opr ops opt ora orb orc ord ore org ori orm orn oro
ort osc osg osp oss ost otp ott oud oui our out owe owl own oxy pac pad pag pai pak pal pan par
pas pat pay pcb pci pcl pcm pcs pdb pdf pdo pec ped pee peg pel pen per pes pet phi php phy pic
pid pie pig pii pin pip pir pis pit pix pkg pkt pla ple pll pls plt ply png pod poi pol pon pop
por pos pot pow ppt pra pre pri prm pro prt psi pst psy psz ptr pts pub pun pur pus put pwd qed
qry qty qua que qui quo rab rac rad rag rah raj ram ran rap rar ras rat raw ray raz rdf reb rec
red ref reg rek rel rem ren rep req rer res ret rev rew rex rez rgb rho rhs rib ric rid rif rig
rij rim rin rio rip ris rit riv rms rnd rng rob roc rod rog roi rol rom rop ros rot rou row roy
roz rpc rpm rsa rsp rss rst rtc rtl rub rud rug rum run rus rut sad sal sam san sap sar sat sav
say sch sci scp scr sdk sea sec sed see seg sei sek sel sem sen seo sep seq ser ses set sex sez
sha she shm shr sic sid sie sig sil sim sin sip sis sit six skb ski sku sky sla sms snd sns soc
sol som son spa spd spe spi spl spo spr spy sql squ src srv ssh ssl sta std ste stk stm sto str
sts stu sty sub sum sun sup sur sus sut svc svg svm svn sym syn sys tab tag tal tam tan tap tar
tas tat tau tax tbl tcp tea tec ted tee tek tel tem ten tep ter tes tet tex tgt tha the thr thy
tic tid tie til tim tin tip tit tls tmp toc tod tog toi tok tol tom ton too top tor tot toy tpl
tra tre tri tro trx try ttl tty tur two txn txt typ ucz uda udp uid uit ula ull ult uma umb umo
ump una unc und une ung uni unk unn uno uns unt upd upp ups upt urb ure urg uri url urn usa usb
use uso usr ust usu utc utf uur vac vak val van var vas vat vec ved veh vel ven ver ves vet vez
vfs via vic vid vie vig vil vim vin vip vir vis vit viz vol von vor vos vox voy vpn vtk vue wal
wan war was wat wav way wcs web wed weg wei wel wen wer who why wid wie wig wij wik wil win wis
wit wnd won woo wor wow www wyn xcb xhr xls xml xmm xor xxx xyz yal yan yat yaw yen yer yes yet
yii you yum zag zap zar zen zer zes zie zig zip zug zza
`
